#!/usr/bin/env bash
# The candidate in its worker on one GPU: the default workdir's verdicts (h200_verdicts.sh), then
# bench_worker.py's in-process vs worker medians on the default workdir and on a ~20 us element-wise
# kernel (tests/workdirs/cuda_scale at 4096 x 4096), side by side. OUT=/tmp/out bash benchmarks/worker_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
OUT="$OUT" TAIL=12 bash benchmarks/h200_verdicts.sh > "$OUT/h200_verdicts.txt" 2>&1
small="$OUT/cuda_scale_4096"; bash benchmarks/cuda_scale_copy.sh "$small" 4096
timeout 300 python3 benchmarks/bench_worker.py . "$small" --max-time 8 > "$OUT/bench_worker.txt" 2>&1; echo "bench rc=$?" >> "$OUT/bench_worker.txt"
cat "$OUT/h200_verdicts.txt" | tail -n 30; echo; cat "$OUT/bench_worker.txt" | tail -n 12
