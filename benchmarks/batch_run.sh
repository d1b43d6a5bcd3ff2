#!/usr/bin/env bash
# How a worker's timed batch grows on one GPU: bench_worker.py on a ~33 us element-wise kernel
# (tests/workdirs/cuda_scale at 2048 x 4096) with batches of 1, 8 and 32 calls (the round trip
# less the worker's figures, per batch, beside the allowance), then worker_calls.py's split of a
# round trip (CUDA IPC per tensor, both ways). OUT=/tmp/out bash benchmarks/batch_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; nproc
  python3 -c "import torch; print(torch.__version__)"; } > "$OUT/env.txt" 2>&1
# the default workdir's build (worker_calls.py's) alongside the benchmark's own
python3 -c "from pathlib import Path; from pytest_cudaopt import extension; extension.build(Path('.').resolve())" \
  > "$OUT/build.txt" 2>&1 &
small="$OUT/cuda_scale_2048"; bash benchmarks/cuda_scale_copy.sh "$small" 2048
timeout "${BENCH_S:-110}" python3 benchmarks/bench_worker.py "$small" --max-time "${MAX_TIME:-2}" \
  --gpu-batch "${BATCHES:-1,8,32}" > "$OUT/bench_worker.txt" 2>&1; echo "bench rc=$?" >> "$OUT/bench_worker.txt"
wait
timeout "${CALLS_S:-60}" python3 benchmarks/worker_calls.py --reps 20 --out "$OUT" > "$OUT/worker_calls_run.txt" 2>&1
echo "calls rc=$?" >> "$OUT/worker_calls_run.txt"
rm -rf "$small"
cat "$OUT/bench_worker.txt"; echo; tail -n 40 "$OUT/worker_calls_run.txt"
