"""Compile a workdir's `cuda_extension` with ninja and torch's build paths, once per state of its tree.
Why an own build.ninja rather than `torch.utils.cpp_extension.load`: a folder keyed by what the objects depend on,
paths relative to the workdir (a copied workdir keeps its build), the compiler's own diagnostics per source,
-fno-gnu-unique (several workdirs' extensions in one process), cuBLAS/cuDNN from the nvidia-* wheels torch loads,
progress per step and a lock shared by xdist workers. Paths, flags and the environment: docs/workdir.md."""

from pytest_cudaopt.candidate.load import defined_functions, missing_function_message, takes_module
from pytest_cudaopt.extension.buildfile import MODULE_NAME, discover_sources
from pytest_cudaopt.extension.diagnostics import BuildError
from pytest_cudaopt.extension.runner import BuildResult, build, build_extension, compile_extension, describe, existing_build
from pytest_cudaopt.extension.toolchain import find_cuda_home, find_library, resolve_arch

__all__ = ["MODULE_NAME", "BuildError", "BuildResult", "build", "build_extension", "compile_extension",
           "defined_functions", "describe", "discover_sources", "existing_build", "find_cuda_home", "find_library",
           "missing_function_message", "resolve_arch", "takes_module"]
