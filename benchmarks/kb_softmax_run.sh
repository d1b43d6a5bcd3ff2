#!/usr/bin/env bash
# KernelBench level1/23_Softmax as published (4096 x 393216 float32: a 6 GiB input) judged by the
# plugin on one GPU: the correctness verdict (profile ci) and the perf verdict, with each item's
# peak device memory (torch max allocated, from the JSON reports) and wall time; logs under $OUT.
#   OUT=/tmp/out bash benchmarks/kb_softmax_run.sh
# The workdir is copied to a scratch folder with the fixed binding files, so the checkout's
# benchmarks/workdirs/kb_softmax stays a plain source folder (the root pytest never collects it).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
WORK="${WORK:-$(mktemp -d)}/kb_softmax"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$WORK"; mkdir -p "$WORK"
cp -r benchmarks/workdirs/kb_softmax/. "$WORK/"
cp pytest_cudaopt/templates/binding.cpp pytest_cudaopt/templates/binding_registry.h "$WORK/"
cp -r pytest_cudaopt/templates/utils "$WORK/utils"
summary="$OUT/kb_softmax_summary.txt"; : > "$summary"
step() {  # step NAME LIMIT_S COMMAND...: run in $WORK under a time limit, log to $OUT/NAME.log, record rc and wall time
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  (cd "$WORK" && timeout "$limit" "$@") > "$OUT/$name.log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-12s rc=%-3s %5d.%01d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) >> "$summary"
  tail -n 40 "$OUT/$name.log"
}
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
} > "$OUT/kb_softmax_gpu.txt" 2>&1
# The build first (its time is not the verdict's), then the verdicts.
step kb_build 300 python3 -m pytest model_new.py -p pytest_cudaopt.plugin -p no:cacheprovider -m correctness \
  -k drawn --cudaopt-case="batch_size=2,dim=1000" -q
step kb_correct 600 python3 -m pytest model_new.py -p pytest_cudaopt.plugin -p no:cacheprovider -m correctness \
  --cudaopt-profile=ci --cudaopt-report="$OUT/kb_correctness.json" -rA ${CORRECTNESS_ARGS:-}
step kb_perf 600 python3 -m pytest model_new.py -p pytest_cudaopt.plugin -p no:cacheprovider -m perf \
  --cudaopt-report="$OUT/kb_perf.json" -rA ${PERF_ARGS:-}
python3 - "$OUT" >> "$summary" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"\n{'item':<48} {'verdict':<8} {'seconds':>8} {'peak GiB':>9}")
for name in ("kb_correctness.json", "kb_perf.json"):
    path = out / name
    if not path.is_file():
        print(f"{name}: missing (see the logs)")
        continue
    for rec in json.loads(path.read_text())["results"]:
        d = rec["data"]
        peak = d.get("peak_bytes")
        label = d.get("case") or d.get("test", "")
        verdict = "pass" if d.get("passed", d.get("gate", {}).get("passed")) else "FAIL"
        secs = d.get("seconds")
        print(f"{d.get('kind', '?') + ' ' + label:<48.48} {verdict:<8} "
              f"{secs if secs is None else round(secs, 1)!s:>8} {'-' if peak is None else f'{peak / 2**30:.1f}':>9}")
EOF
cat "$OUT/kb_softmax_gpu.txt"; echo; cat "$summary"
