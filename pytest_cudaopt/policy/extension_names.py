"""The `cuda_extension` functions that model_new.py calls exist in the built module (needs a build)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_cudaopt.policy.rules import BUILD_RULES, Violation
from pytest_cudaopt.candidate.construct import called_functions, missing_functions  # noqa: F401

RULE = "EX001"
RULE_TEXT = BUILD_RULES[RULE]


def check_extension_names(workdir: Path, module: Any) -> list[Violation]:
    """EX001 for every function that model_new.py calls and the built `module` lacks."""
    return extension_violations(missing_functions(workdir, module))


def extension_violations(missing: list) -> list[Violation]:
    """EX001 from the facts of worker.construct.missing_functions: (line, name, why)."""
    return [Violation("model_new.py", int(line), RULE, str(why)) for line, _, why in missing]
