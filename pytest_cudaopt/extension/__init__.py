"""Compile a workdir's `cuda_extension` with ninja and torch's build paths, once per state of its tree.

What it offers: `build` (compile and import; `build_extension` returns the module),
`compile_extension` (compile only), `existing_extension` (the last build on disk, compiling
nothing; `existing_build` its .so, imported nowhere), `BuildResult` / `describe`, `BuildError` (a failed build as the compiler's own
`file:line: error` lines), `resolve_arch`, and the loaded module's introspection
(`defined_functions`, `missing_function_message`, `takes_module`).

The modules: toolchain.py (the CUDA toolkit, cuBLAS/cuDNN, the arch), buildfile.py (the
configuration and the build.ninja text), diagnostics.py (the compiler's errors relative to the
workdir), loader.py (importing the .so), runner.py (ninja under a lock).

Sources: `binding.cpp` and every `kernels/*.cu` and `kernels/*.cpp`. The build folder is
`<workdir>/build/cudaopt/<key>/` (root: `--cudaopt-build-dir`, env CUDAOPT_BUILD_DIR or ini
cudaopt_build_dir, relative to the workdir), where the key hashes what every object
depends on besides the sources: torch, Python and CUDA versions, the arch, the extra
flags. ninja recompiles only the sources that changed (headers included, via depfiles);
an unchanged tree costs well under a second in-process. The folder holds build.ninja,
build.log (the last build's full output), objs/ and cuda_extension.so, and names the
workdir's files by relative paths, so a copied workdir keeps its build.

Flags:
  TORCH_CUDA_ARCH_LIST   "9.0", "9.0a", "8.0;9.0+PTX", "Hopper"; else the visible GPU's
                         capability, else 9.0 (`resolve_arch()` says which and why). A
                         9.0 cubin is built as sm_90a, which every sm_90 GPU runs (wgmma).
  extra flags            settings cxx_flags / nvcc_flags: --cudaopt-cxx-flags,
                         --cudaopt-nvcc-flags, env CUDAOPT_CXX_FLAGS / CUDAOPT_NVCC_FLAGS,
                         ini cudaopt_cxx_flags / cudaopt_nvcc_flags; space separated,
                         after the defaults (host: -O3 -std=c++20 -fPIC, the standard
                         torch builds extensions with; nvcc: the same plus
                         --expt-relaxed-constexpr -lineinfo and the -gencode flags).
  CUDA_HOME, CUDA_PATH   the toolkit; else /usr/local/cuda, else the nvcc on PATH
                         (symlinks and wrapper scripts followed).
  CXX, MAX_JOBS          host compiler (default c++) and ninja's parallelism.

A workdir without .cu files whose sources include no CUDA header builds as a CPU-only C++
extension (no nvcc, no CUDA libraries). cuBLAS/cuBLASLt and cuDNN headers and libraries
are taken from the nvidia-* wheels next to torch (what a torch process loads) or the
toolkit, and linked, with an rpath, when a source includes their headers.

Why an own build.ninja rather than `torch.utils.cpp_extension.load(..., build_directory=...)`
(which also writes one and runs ninja): only the own writer gives
  - a build folder keyed by what the objects depend on (torch, Python, CUDA, arch, flags),
    so switching torch or arch never reuses stale objects and switching back rebuilds nothing;
  - paths relative to the workdir, so a copied workdir keeps its build;
  - the compiler's own diagnostics, relative to the workdir, per failed source, with the
    workdir line that included a failing header (load() raises one RuntimeError);
  - -fno-gnu-unique (below) so that several workdirs' extensions load in one process;
  - cuBLAS/cuDNN headers and libraries from the nvidia-* wheels torch itself loads;
  - progress per step and a lock shared by parallel pytest-xdist workers.
torch's cpp_extension is still the source of the include and library paths (`toolchain.cpp_extension_module`).
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
