#!/usr/bin/env bash
# The worker's timed batches on one GPU: the gate probe (gate_probe.py: stream memory operations
# on shared host memory, confined and not), the default workdir and element-wise kernels
# (tests/workdirs/cuda_scale at SIZES x 4096, default 2048 and 4096 rows: ~33 us and ~62 us) timed
# in-process and through the worker side by side (bench_worker.py: medians, ratios, the figures
# raised), then the GPU tests of timing and verdicts (SKIP_PROBE=1: no probe; SKIP_TESTS=1: no
# tests; GPU_BATCH: --gpu-batch of the first bench, default 0, the harness's; BATCHES=1,16: the first
# size's kernel in longer batches too).
#   OUT=/tmp/out bash benchmarks/timing_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; uname -r; nproc
  python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_properties(0))"; } > "$OUT/env.txt" 2>&1
if [ -z "${SKIP_PROBE:-}" ]; then
  timeout 150 python3 benchmarks/gate_probe.py --confine --no-after --reps 60 --out "$OUT" > "$OUT/gate_probe.txt" 2>&1
  echo "gate_probe rc=$?" >> "$OUT/gate_probe.txt"
fi
read -ra sizes <<< "${SIZES:-2048 4096}"
for size in "${sizes[@]}"; do bash benchmarks/cuda_scale_copy.sh "$OUT/cuda_scale_$size" "$size"; done
timeout "${BENCH_S:-300}" python3 benchmarks/bench_worker.py . "${sizes[@]/#/$OUT/cuda_scale_}" --gpu-batch "${GPU_BATCH:-0}" \
  --max-time "${MAX_TIME:-4}" > "$OUT/bench_worker.txt" 2>&1; echo "bench rc=$?" >> "$OUT/bench_worker.txt"
if [ -n "${BATCHES:-}" ]; then  # longer batches of the smallest kernel: how tight the gate's bound gets
  timeout "${BENCH_S:-300}" python3 benchmarks/bench_worker.py "$OUT/cuda_scale_${sizes[0]}" --max-time "${MAX_TIME:-4}" \
    --gpu-batch "$BATCHES" > "$OUT/bench_batches.txt" 2>&1; echo "bench rc=$?" >> "$OUT/bench_batches.txt"
fi
rm -rf "$OUT"/cuda_scale_*
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TESTS_S:-240}" python3 -m pytest tests/test_gpu_verdicts.py tests/exploits tests/test_timing.py tests/test_judge_children.py \
    -m gpu -q -p no:randomly > "$OUT/gpu_tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/gpu_tests.txt"
fi
tail -n 25 "$OUT/gate_probe.txt" 2>/dev/null; echo; tail -n 16 "$OUT/bench_worker.txt"; echo
tail -n 12 "$OUT/bench_batches.txt" 2>/dev/null; echo; tail -n 8 "$OUT/gpu_tests.txt" 2>/dev/null
