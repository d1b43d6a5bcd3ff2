#!/usr/bin/env bash
# Build this workdir's cuda_extension and print the build time.
#   TORCH_CUDA_ARCH_LIST=9.0 bash utils/compile.sh
# Extra flags: CUDAOPT_NVCC_FLAGS="-lineinfo" CUDAOPT_CXX_FLAGS="-g" bash utils/compile.sh
set -euo pipefail
workdir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$workdir"
exec "${PYTHON:-python3}" -m pytest_cudaopt.cli build "$workdir"
