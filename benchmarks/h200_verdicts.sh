#!/usr/bin/env bash
# The default workdir's verdicts on one GPU, timed, from a checkout with nothing installed:
#   OUT=/tmp/out bash benchmarks/h200_verdicts.sh
# 1. the build from cold (utils/compile.sh), 2. one `pytest model_new.py -m "correctness or perf
# or memsafety"` session (its JSON report, JUnit file and wall time), 3. the memory-safety item
# on the planted faults of tests/workdirs/cuda_memsafety and the kernel tests. Logs and reports
# go to $OUT; a summary (rc and wall time of each step, the report's verdicts) prints last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
summary="$OUT/summary.txt"; : > "$summary"
step() {  # step NAME LIMIT_S COMMAND...: under a time limit, logged to $OUT/NAME.log, rc and wall time recorded
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-12s rc=%-3s %5d.%01d s   %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$*" >> "$summary"
  tail -n "${TAIL:-6}" "$OUT/$name.log"
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
  command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer
} > "$OUT/gpu.txt" 2>&1
rm -rf build/cudaopt
step build 240 bash utils/compile.sh
TAIL=45 step verdicts 330 python3 -m pytest model_new.py -m "correctness or perf or memsafety" -p no:cacheprovider \
  -rA --cudaopt-report="$OUT/verdicts.json" --junitxml="$OUT/verdicts.xml" ${VERDICT_ARGS:-}
[ -n "${SKIP_TESTS:-}" ] || TAIL=15 step gpu_tests 300 python3 -m pytest tests/test_memsafety_gpu.py \
  tests/test_kernels_gpu.py -q -p no:cacheprovider -rs
python3 - "$OUT/verdicts.json" <<'PY' >> "$summary" 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
print("report:", d["schema"], "passed", d["passed"], "complete", d["complete"], d.get("counts"), d.get("not_passed"))
for r in d["results"]:
    row = r.get("row", {})
    print(" ", r["kind"], row.get("case", ""), row.get("precision", ""), row.get("verdict", ""),
          {k: row[k] for k in ("custom", "compile", "vs compile") if k in row} or "")
PY
cat "$OUT/gpu.txt"; echo; cat "$summary"
