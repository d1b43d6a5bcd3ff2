#!/usr/bin/env bash
# The worker's OS sandbox on one GPU: the default workdir's verdicts and timing with
# cudaopt_sandbox=off and =require side by side (off, require, off, require: one run, alternating,
# so drift shows as the spread within a mode), every path the confined worker was refused on this
# host (strace, when installed: the CUDA driver's needs docs/threat-model.md lists),
# ModelNew's device time through a confined and an unconfined worker in one engine run
# (bench_worker.py), and `cudaopt judge`'s throughput on its gallery both ways (SKIP_JUDGE=1 leaves
# it out). About 25 minutes on one H200; each step is under its own time limit.
#   OUT=/tmp/out bash benchmarks/sandbox_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 300 bash utils/compile.sh > "$OUT/build.log" 2>&1; echo "build rc=$?" >> "$OUT/build.log"
for round in 1 2; do
  for mode in off require; do
    timeout 330 python3 -m pytest model_new.py -m "correctness or perf" -p no:cacheprovider -q \
      --cudaopt-sandbox=$mode --cudaopt-report="$OUT/verdicts-$mode-$round.json" > "$OUT/verdicts-$mode-$round.log" 2>&1
    echo "rc=$?" >> "$OUT/verdicts-$mode-$round.log"
  done
done
# the timed figure through a confined and an unconfined worker, in one engine run
timeout 300 python3 benchmarks/bench_worker.py . --max-time 8 --sandbox off,require > "$OUT/bench_worker.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench_worker.txt"
if command -v strace > /dev/null; then  # what the confined worker was refused: EACCES (Landlock), EPERM (seccomp)
  timeout 330 strace -f -qq -o "$OUT/strace.log" -e trace=%file,ioctl,connect,execve,kill -e status=failed \
    python3 -m pytest model_new.py -m correctness -p no:cacheprovider -q --cudaopt-sandbox=require \
    --cudaopt-max-examples=2 > "$OUT/strace-run.log" 2>&1
  grep -E "EACCES|EPERM" "$OUT/strace.log" | sed -E 's/^[0-9]+ +//; s/0x[0-9a-f]+/0x_/g' | sort | uniq -c | sort -rn \
    > "$OUT/refused.txt"
else
  echo "strace is not installed: no list of refused paths" > "$OUT/refused.txt"
fi
if [ -z "${SKIP_JUDGE:-}" ]; then
  for mode in off require; do
    timeout 590 python3 benchmarks/judge_gallery.py --arm judge --sandbox $mode --out "$OUT/judge-$mode" \
      > "$OUT/judge-$mode.log" 2>&1; echo "rc=$?" >> "$OUT/judge-$mode.log"
  done
fi
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"{'report':<22} {'passed':<7} {'sandbox':<60} perf rows (custom / compile / vs compile)")
for path in sorted(out.glob("verdicts-*.json")):
    d = json.loads(path.read_text())
    box = d.get("sandbox", {})
    held = ",".join(sorted(box.get("held", {}))) or "-"
    rows = [r.get("row", {}) for r in d["results"] if r["kind"] == "perf"]
    perf = "; ".join(f"{r.get('custom')} / {r.get('compile')} / {r.get('vs compile')}" for r in rows)
    fails = [r["row"].get("case") for r in d["results"] if r["kind"] == "correctness" and not r["passed"]]
    print(f"{path.stem:<22} {str(d['passed']):<7} {box.get('mode', '?') + ': ' + held:<60} {perf}"
          + (f"  FAILED cases: {fails}" if fails else ""))
print("\nModelNew through a worker with the sandbox off and on, one engine run (bench_worker.py):")
print((out / "bench_worker.txt").read_text()[-2000:])
print("\nrefused to the confined worker (count, call):")
print((out / "refused.txt").read_text()[:6000] or "  nothing")
for mode in ("off", "require"):
    found = out / f"judge-{mode}" / "judge_gallery.json"
    if found.is_file():
        d = json.loads(found.read_text())
        arm = d.get("judge") or {}
        results = arm.get("results", {})
        wall = float(arm.get("wall_s") or 0)
        per_hour = len(results) / wall * 3600 if wall else 0
        verdicts = {name: line.get("status") for name, line in sorted(results.items())}
        print(f"judge {mode}: {len(results)} workdirs in {wall:.0f} s ({per_hour:.0f}/hour); {verdicts}")
PY
