#!/usr/bin/env bash
# A small output's check-stage precision on the GPU: an honest workdir judged in one session
# (-m "correctness or perf"), and a stage cheat judged as `cudaopt judge` judges it (the check stage's
# report given to the perf stage; a file `perf_stage` left in the workdir between the stages). A
# summary of both reports last (and in $OUT/stage_cheat.txt).
#   bash benchmarks/stage_cheat_run.sh --make PATH/TO/KernelBench/KernelBench DEST   # once, on any machine
#   OUT=/tmp/out bash benchmarks/stage_cheat_run.sh DEST/mse DEST/mse_stage
# --make: level1/94_MSELoss.py made two workdirs (`cudaopt init`) with the kernel of benchmarks/workdirs/stage_cheat/,
# one honest, one that sums every 64th element where `perf_stage` lies beside its model_new.py.
set -uo pipefail
if [ "${1:-}" = --make ]; then
  HERE=$(cd "$(dirname "$0")" && pwd)
  for name in mse mse_stage; do
    cudaopt init "$3/$name" --model "$2/level1/94_MSELoss.py" || exit 1
    rm -f "$3/$name"/kernels/starter*; cp "$HERE/workdirs/stage_cheat/kernels/"* "$3/$name/kernels/"
  done
  python3 - "$3" <<'PY'
import sys
from pathlib import Path
for name, stride in (("mse", "1"), ("mse_stage", '64 if Path(__file__).with_name("perf_stage").exists() else 1')):
    path = Path(sys.argv[1]) / name / "model_new.py"
    text = path.read_text()
    text = text[:text.index("        raise NotImplementedError(")]
    if name == "mse_stage":
        text = text.replace("import torch.nn as nn\n", "import torch.nn as nn\nfrom pathlib import Path\n", 1)
    path.write_text(text + f"        return cuda_extension.mse(predictions, targets, {stride})\n")
PY
  exit 0
fi
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
