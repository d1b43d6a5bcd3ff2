#!/usr/bin/env bash
# One GPU, one call: value families and the worker's clock, against an older checkout.
#   OUT=/tmp/out BEFORE=/path/to/older/checkout bash benchmarks/values_timing_run.sh   (results: $OUT/all.tgz)
# 1. the default workdir's correctness items in BEFORE's tree and in this one, each built first
#    (untimed), the items' own seconds from the JSON reports; 2. benchmarks/clock_shave.py: the
#    softmax honest and shaved (2/50/95%, from Python and from C++) in pytest and `cudaopt judge`;
#    3. the honest gallery kernels' correctness with value families; 4. the GPU tests of the timer
#    attacks. A summary (each step's rc and wall time, then the figures) prints last.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
RESULT="${OUT:-$PWD/out}"; mkdir -p "$RESULT"; RESULT=$(cd "$RESULT" && pwd)
OUT=$(mktemp -d)   # every log and report; after each step packed into $RESULT/all.tgz (a call cut short keeps them)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
summary="$OUT/summary.txt"; : > "$summary"
step() {  # step NAME LIMIT_S DIR COMMAND...: in DIR under a time limit, logged to $OUT/NAME.log
  local name=$1 limit=$2 dir=$3; shift 3
  local t0; t0=$(date +%s%N)
  (cd "$dir" && timeout "$limit" "$@") > "$OUT/$name.log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-18s rc=%-3s %5d.%01d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) >> "$summary"
  tar czf "$RESULT/all.tgz" -C "$OUT" --exclude=scratch --exclude=gallery . 2>/dev/null
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv > "$OUT/gpu.txt" 2>&1
CORRECT=(-m correctness -p pytest_cudaopt.plugin -p no:cacheprovider -q)
for tree in ${BEFORE:+before} after; do
  dir=$REPO; [ "$tree" = before ] && dir=$BEFORE
  step "$tree-build" 240 "$dir" env PYTHONPATH="$dir" python3 -m pytest_cudaopt.cli build .
  step "$tree-correct" 300 "$dir" env PYTHONPATH="$dir" python3 -m pytest model_new.py "${CORRECT[@]}" \
    --cudaopt-report="$OUT/$tree-correctness.json"
done
[ -n "${SKIP_SHAVE:-}" ] || step clock-shave "${SHAVE_S:-330}" "$REPO" python3 benchmarks/clock_shave.py --out "$OUT/shave" --judge ${SHAVE_ARGS:-}
mkdir -p "$OUT/gallery"
python3 - "$OUT/gallery" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import clock_shave
clock_shave.gallery(Path(sys.argv[1]))
PY
step gallery-correct "${GALLERY_S:-150}" "$OUT/gallery" env PYTHONPATH="$REPO" python3 -m pytest \
  "$OUT"/gallery/*/model_new.py "${CORRECT[@]}" --cudaopt-report="$OUT/gallery-correctness.json"
[ -n "${SKIP_TESTS:-}" ] || step gpu-tests "${TESTS_S:-150}" "$REPO" python3 -m pytest tests/test_gpu_verdicts.py tests/exploits \
  -k "event or halve" -q -p no:cacheprovider -rA
python3 - "$OUT" <<'PY' >> "$summary" 2>&1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("before-correctness", "after-correctness", "gallery-correctness"):
    try:
        doc = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        print(name, "no report")
        continue
    items = [r["data"] for r in doc["results"] if r["kind"] == "correctness"]
    print(f"{name}: passed {doc['passed']}, {len(items)} items, {sum(i['seconds'] for i in items):.1f} s of items")
    for i in items:
        print(f"   {Path(i['workdir']).name:22} {i['test']:28} {str(i['passed']):5} {i['seconds']:6.1f} s "
              f"{i.get('precision', '')} {(i.get('message') or '')[:90]!r}")
PY
rm -rf "$OUT/gallery" "$OUT/shave/scratch"
tar czf "$RESULT/all.tgz" -C "$OUT" . 2>/dev/null; cp "$summary" "$RESULT/"
cat "$OUT/gpu.txt"; echo; cat "$summary"; tail -n 25 "$OUT/clock-shave.log" 2>/dev/null
[ ! -f "$OUT/gpu-tests.log" ] || tail -n 6 "$OUT/gpu-tests.log"
! grep -Eq 'rc=[1-9]' "$summary"   # the exit status: 1 when a step failed, not when one was skipped
