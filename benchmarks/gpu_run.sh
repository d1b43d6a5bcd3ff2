#!/usr/bin/env bash
# One full GPU run from a checkout (nothing installed): cold and warm build, the correctness
# verdict, the speed verdict, the timing engine's self-checks; logs under $OUT (default ./out).
#   bash benchmarks/gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
summary="$OUT/summary.txt"; : > "$summary"
step() {  # step NAME LIMIT_S COMMAND...: run under a time limit, log to $OUT/NAME.log, record rc and wall time
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-12s rc=%-3s %4d.%01d s   %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$*" >> "$summary"
  tail -n 30 "$OUT/$name.log"
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
} > "$OUT/gpu.txt" 2>&1
rm -rf build/cudaopt
step build_cold 240 bash utils/compile.sh
step build_warm 60 bash utils/compile.sh
step correctness 200 python3 -m pytest model_new.py -m correctness -p no:cacheprovider \
  --cudaopt-report="$OUT/correctness.json" ${CORRECTNESS_ARGS:-}
step perf 200 python3 -m pytest model_new.py -m perf -p no:cacheprovider --benchmark-autosave \
  --benchmark-storage="file://$OUT/benchmarks" --cudaopt-report="$OUT/perf.json" ${PERF_ARGS:-}
step timing 300 env OUT="$OUT" python3 benchmarks/check_timing.py
step gpu_tests 60 python3 -m pytest tests/test_timing.py tests/test_guards.py -q -p no:cacheprovider
cat "$OUT/gpu.txt"; echo; cat "$summary"
