#!/usr/bin/env bash
# A small output's check-stage precision on the GPU: an honest workdir judged in one session
# (-m "correctness or perf"), and a stage cheat judged as `cudaopt judge` judges it (the check stage's
# report given to the perf stage; a file `perf_stage` left in the workdir between the stages). A
# summary of both reports last (and in $OUT/stage_cheat.txt).
#   OUT=/tmp/out bash benchmarks/stage_cheat_run.sh HONEST_WORKDIR CHEAT_WORKDIR
set -uo pipefail
HONEST=$(cd "$1" && pwd); CHEAT=$(cd "$2" && pwd)
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
ARGS=(-p no:cacheprovider -p no:randomly -p no:benchmark --cudaopt-device=cuda)
for wd in "$HONEST" "$CHEAT"; do rm -f "$wd/perf_stage"; cudaopt build "$wd" > "$OUT/$(basename "$wd")-build.log" 2>&1; done
python3 -m pytest "$HONEST" -m "correctness or perf" "${ARGS[@]}" --cudaopt-report="$OUT/honest.json" \
  > "$OUT/honest.log" 2>&1
python3 -m pytest "$CHEAT" -m correctness "${ARGS[@]}" --cudaopt-report="$OUT/cheat-check.json" \
  > "$OUT/cheat-check.log" 2>&1
touch "$CHEAT/perf_stage"
python3 -m pytest "$CHEAT" -m perf "${ARGS[@]}" --cudaopt-correctness-report="$OUT/cheat-check.json" \
  --cudaopt-report="$OUT/cheat-perf.json" > "$OUT/cheat-perf.log" 2>&1
rm -f "$CHEAT/perf_stage"
python3 - "$OUT" <<'PY' | tee "$OUT/stage_cheat.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("honest", "cheat-check", "cheat-perf"):
    path = out / f"{name}.json"
    if not path.exists():
        print(f"{name}: no report"); continue
    for r in json.loads(path.read_text())["results"]:
        d = r["data"]
        if r["kind"] == "correctness":
            p = d.get("precision") or {}
            print(f"{name:12} {d['case'][:40]:40} {'pass' if d['passed'] else 'FAIL'} {d['seconds']:6.1f} s "
                  f"(harness {d.get('harness_seconds', 0):5.1f} s) cases={d.get('cases')} sets={p.get('sets')} "
                  f"error={p.get('candidate_error')} ref={p.get('reference_error')} {p.get('tier')}")
        elif r["kind"] == "perf":
            g = d.get("gate") or {}
            print(f"{name:12} perf {'pass' if d['passed'] else 'FAIL'} speedup={g.get('speedup')} tier={d.get('precision')} "
                  f"timed={d.get('timed_precision')}\n{'':12} reason: {(g.get('reason') or '')[:400]}")
PY
