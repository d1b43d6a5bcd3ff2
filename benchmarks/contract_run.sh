#!/usr/bin/env bash
# A workdir written to the agent-workdir contract (benchmarks/workdirs/global_l2norm: its own
# model.py, model_new.py and kernels/, bindings in the REGISTER_BINDING(op, register_op) form),
# judged as it is on the GPU. The run copy gets the fixed files and utils/ that `cudaopt init`
# ships and a lock from `cudaopt adopt`; nothing else is changed. Logs under $OUT (default ./out).
#   bash benchmarks/contract_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
WD="$OUT/global_l2norm"
rm -rf "$WD"; cp -r benchmarks/workdirs/global_l2norm "$WD"
python3 - "$WD" <<'PY'
import shutil, sys
from pathlib import Path
from pytest_cudaopt import policy, scaffold
wd = Path(sys.argv[1])
for name in policy.PROTECTED_TEMPLATES:
    shutil.copyfile(policy.TEMPLATES / name, wd / name)
shutil.copytree(policy.TEMPLATES / "utils", wd / "utils", ignore=shutil.ignore_patterns("__pycache__"))
(wd / "conftest.py").write_text(scaffold.CONFTEST)
(wd / "pyproject.toml").write_text(scaffold.PYPROJECT)
PY
summary="$OUT/contract_summary.txt"; : > "$summary"
step() {  # step NAME LIMIT_S COMMAND...: run in the workdir, log to $OUT/NAME.log, record rc and wall time
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  (cd "$WD" && timeout "$limit" "$@") > "$OUT/$name.log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-14s rc=%-3s %4d.%01d s   %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$*" >> "$summary"
  tail -n 25 "$OUT/$name.log"
}
step adopt 120 python3 -m pytest_cudaopt.cli adopt .
step compile 300 bash utils/compile.sh
step pytest 480 python3 -m pytest . -m "correctness or perf or policy" -p no:cacheprovider -v \
  --cudaopt-report="$OUT/contract.json" --junitxml="$OUT/contract_junit.xml"
step verification 300 python3 -m utils.verification
step profiling 300 python3 -m utils.profiling --iters 10
step single_run 120 python3 -m utils.profiling --single-run torch_baseline,torch_compile,cuda_extension
step check 120 python3 -m pytest_cudaopt.cli check .
{ echo; echo "== classic lines"
  grep -h -E '^\[(PASS|FAIL)\] |^Torch Baseline: |^single run: ' "$OUT/verification.log" "$OUT/profiling.log" \
    "$OUT/single_run.log"
  echo; echo "== pytest"; grep -E '(passed|failed)' "$OUT/pytest.log" | tail -n 1
  echo; cat "$summary"; } | tee "$OUT/contract_table.txt"
