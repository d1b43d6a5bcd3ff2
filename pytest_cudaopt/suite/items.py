"""The items the plugin collects under each workdir's model_new.py: one class per verdict, the build first."""

from pytest_cudaopt.suite.build import TestBuild  # noqa: F401
from pytest_cudaopt.suite.correctness import TestCorrectness  # noqa: F401
from pytest_cudaopt.suite.memsafety import TestMemorySafety  # noqa: F401
from pytest_cudaopt.suite.perf import TestPerf  # noqa: F401
from pytest_cudaopt.suite.policy import TestPolicy  # noqa: F401
