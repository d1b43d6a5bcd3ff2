#!/usr/bin/env bash
# A runnable copy of tests/workdirs/cuda_scale (an element-wise kernel) at ROWS x 4096 floats:
#   bash benchmarks/cuda_scale_copy.sh DEST ROWS
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$1 rows=$2
rm -rf "$dest"; mkdir -p "$dest"
cp -r tests/workdirs/cuda_scale/. "$dest/"; cp tests/workdirs/_shared/model.py binding.cpp binding_registry.h "$dest/"
sed -i "s/^batch_size = .*/batch_size = $rows/; s/^features = .*/features = 4096/" "$dest/model.py"
