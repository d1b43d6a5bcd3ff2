"""Compile a workdir's `cuda_extension` with ninja and torch's build paths, once per state of its tree.

Sources: `binding.cpp` and every `kernels/*.cu` and `kernels/*.cpp`, built in
`<workdir>/build/cudaopt/<key>/` (root: `--cudaopt-build-dir`, env CUDAOPT_BUILD_DIR or ini
cudaopt_build_dir), the key hashing torch, Python and CUDA versions, the arch and the extra flags.
Why an own build.ninja rather than `torch.utils.cpp_extension.load`: a folder keyed by what the
objects depend on, paths relative to the workdir (a copied workdir keeps its build), the compiler's
own diagnostics per source, -fno-gnu-unique (several workdirs' extensions in one process),
cuBLAS/cuDNN from the nvidia-* wheels torch loads, progress per step and a lock shared by xdist workers.

Flags:
  TORCH_CUDA_ARCH_LIST   "9.0", "9.0a", "8.0;9.0+PTX", "Hopper"; else the visible GPU's
                         capability, else 9.0 (`resolve_arch()` says which and why). A
                         9.0 cubin is built as sm_90a, which every sm_90 GPU runs (wgmma).
  extra flags            settings cxx_flags / nvcc_flags: --cudaopt-cxx-flags,
                         --cudaopt-nvcc-flags, env CUDAOPT_CXX_FLAGS / CUDAOPT_NVCC_FLAGS,
                         ini cudaopt_cxx_flags / cudaopt_nvcc_flags; space separated,
                         after the defaults (host: -O3 -std=c++20 -fPIC; nvcc: the same plus
                         --expt-relaxed-constexpr -lineinfo and the -gencode flags).
  CUDA_HOME, CUDA_PATH   the toolkit; else /usr/local/cuda, else the nvcc on PATH.
  CXX, MAX_JOBS          host compiler (default c++) and ninja's parallelism.
"""

from pytest_cudaopt.extension.buildfile import MODULE_NAME, discover_sources
from pytest_cudaopt.extension.diagnostics import BuildError
from pytest_cudaopt.extension.loader import defined_functions, missing_function_message, takes_module
from pytest_cudaopt.extension.runner import BuildResult, build, build_extension, compile_extension, describe, existing_build, existing_extension
from pytest_cudaopt.extension.toolchain import find_cuda_home, find_library, resolve_arch

__all__ = [
    "MODULE_NAME", "BuildError", "BuildResult", "build", "build_extension", "compile_extension",
    "defined_functions", "describe", "discover_sources", "existing_build", "existing_extension", "find_cuda_home",
    "find_library", "missing_function_message", "resolve_arch", "takes_module",
]
