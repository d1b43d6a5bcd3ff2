#!/usr/bin/env bash
# GPU runs from a checkout (nothing installed), each step under a time limit; logs in a scratch
# folder packed into $OUT/logs.tgz, a summary table last (and in $OUT/summary.txt).
#   bash benchmarks/gpu_run.sh [STEP ...]        default: build correctness perf timing gpu_tests
# Steps: build (cold and warm), correctness, perf (the root workdir), timing
# (benchmarks/check_timing.py), gpu_tests (tests/test_gpu_verdicts.py and the GPU timing tests),
# contract (benchmarks/contract_run.sh), gate (benchmarks/gate_run.sh), kb_softmax
# (benchmarks/kb_softmax_run.sh), linear (benchmarks/bench_linear.py), attention
# (benchmarks/bench_attention.py), kernel_tests (tests/test_kernels_gpu.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
summary="$OUT/summary.txt"; : > "$summary"
step() {  # step NAME LIMIT_S COMMAND...: run under a time limit, log to $LOGS/NAME.log, record rc and wall time
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-14s rc=%-3s %5d.%01d s   %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$*" >> "$summary"
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
} > "$LOGS/gpu.txt" 2>&1
for s in "${@:-build correctness perf timing gpu_tests}"; do for name in $s; do case $name in
  build)
    rm -rf build/cudaopt
    step build_cold 240 bash utils/compile.sh
    step build_warm 60 bash utils/compile.sh ;;
  correctness)
    step correctness 200 python3 -m pytest model_new.py -m correctness -p no:cacheprovider \
      --cudaopt-report="$LOGS/correctness.json" ${CORRECTNESS_ARGS:-} ;;
  perf)
    TAIL=40 step perf 200 python3 -m pytest model_new.py -m perf -p no:cacheprovider --benchmark-autosave \
      --benchmark-storage="file://$LOGS/benchmarks" --cudaopt-report="$LOGS/perf.json" ${PERF_ARGS:-} ;;
  timing) OUT=$LOGS step timing 330 python3 benchmarks/check_timing.py ;;
  gpu_tests)
    step gpu_tests 420 python3 -m pytest tests/test_gpu_verdicts.py tests/test_timing.py tests/test_trace.py \
      tests/test_kernels_gpu.py \
      -q -p no:cacheprovider
    step gpu_exploits 300 python3 -m pytest tests/exploits -m gpu -q -p no:cacheprovider ;;
  contract) OUT=$LOGS TAIL=40 step contract 420 bash benchmarks/contract_run.sh ;;
  gate) OUT=$LOGS TAIL=40 step gate 420 bash benchmarks/gate_run.sh ;;
  kb_softmax) OUT=$LOGS TAIL=40 step kb_softmax 540 bash benchmarks/kb_softmax_run.sh ;;
  linear) TAIL=30 step linear 240 python3 benchmarks/bench_linear.py --out "$LOGS" ;;
  attention) TAIL=30 step attention 300 python3 benchmarks/bench_attention.py --out "$LOGS" ;;
  kernel_tests) step kernel_tests 420 python3 -m pytest tests/test_kernels_gpu.py -q -p no:cacheprovider ;;
  *) echo "gpu_run.sh: unknown step $name" >&2 ;;
esac; done; done
tar czf "$OUT/logs.tgz" --exclude=build --exclude="*.so" --exclude="*.o" --exclude=__pycache__ -C "$LOGS" . 2>/dev/null
cat "$LOGS/gpu.txt"; echo; cat "$summary"
