#!/usr/bin/env bash
# The default workdir's verdicts, timed for several checkouts side by side on one GPU:
#   OUT=/tmp/out ROUNDS=1 bash benchmarks/verdicts_vs.sh TREE...
# A TREE is a checkout's root (`.`, or one unpacked by `git archive <commit> | tar -x -C DIR`). The
# first tree builds from cold (utils/compile.sh); the others start from a copy of its build folder
# (keyed: a tree whose key differs builds its own). Then, ROUNDS times, each tree in turn runs
# `pytest model_new.py -m "correctness or perf or memsafety" --durations=12` with fresh Inductor
# and Triton caches. Logs and reports go to $OUT/runs.tgz (<round>-<n>/); the table (wall time,
# pytest's own time, the perf and memory-safety items' own, outcome, the speedup over
# torch.compile) prints last and is kept in $OUT/table.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: OUT=DIR bash benchmarks/verdicts_vs.sh TREE..." >&2; exit 2; }
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
table="$OUT/table.txt"; printf '%-6s %-20s %8s %9s %7s %7s  %s\n' round tree wall_s pytest_s perf_s mem_s outcome > "$table"
first=""
i=0
for tree in "$@"; do
  i=$((i + 1))
  ( cd "$tree" || exit 1
    if [ -n "$first" ] && [ -d "$first/build/cudaopt" ]; then mkdir -p build && cp -a "$first/build/cudaopt" build/; fi
    timeout 300 bash utils/compile.sh > "$OUT/build-$i.log" 2>&1; echo "build $tree rc=$?" >> "$OUT/builds.txt" )
  [ -n "$first" ] || first=$(cd "$tree" && pwd)
done
for round in $(seq "${ROUNDS:-1}"); do
  i=0
  for tree in "$@"; do
    i=$((i + 1)); dir="$OUT/$round-$i"; mkdir -p "$dir/inductor" "$dir/triton"
    t0=$(date +%s%N)
    ( cd "$tree" && TORCHINDUCTOR_CACHE_DIR="$dir/inductor" TRITON_CACHE_DIR="$dir/triton" timeout 330 \
        python3 -m pytest model_new.py -m "correctness or perf or memsafety" -p no:cacheprovider -rA --durations=12 \
        --cudaopt-report="$dir/verdicts.json" --junitxml="$dir/verdicts.xml" > "$dir/pytest.log" 2>&1 )
    rc=$?; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    rm -rf "$dir/inductor" "$dir/triton"
    own=$(grep -Eo '(passed|failed|error)[^=]* in [0-9.]+s' "$dir/pytest.log" | tail -1 | grep -Eo '[0-9.]+s$' | tr -d s)
    outcome=$(python3 - "$dir/verdicts.json" "$rc" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"rc={sys.argv[2]} no report ({exc.__class__.__name__})"); sys.exit()
perf = [r.get("row", {}) for r in d["results"] if r["kind"] == "perf"]
print(f"rc={sys.argv[2]} passed={d['passed']} {d.get('counts')}", *(f"{p.get('vs compile', '')}" for p in perf))
PY
)
    grep -A14 "slowest 12 durations" "$dir/pytest.log" | grep -E "^[0-9.]+s" > "$dir/durations.txt"
    perf=$(grep -m1 "call .*test_speedup" "$dir/durations.txt" | grep -Eo '^[0-9.]+')
    mem=$(grep -m1 "call .*test_memory_safety" "$dir/durations.txt" | grep -Eo '^[0-9.]+')
    printf '%-6s %-20s %8d.%01d %9s %7s %7s  %s\n' "$round" "$tree" $((ms / 1000)) $((ms % 1000 / 100)) "${own:-?}" \
      "${perf:-?}" "${mem:-?}" "$outcome" >> "$table"
  done
done
for dir in "$OUT"/*-*/; do echo "== $dir"; head -6 "$dir/durations.txt"; done
(cd "$OUT" && tar -czf runs.tgz ./*-*/ build-*.log && rm -rf ./*-*/ build-*.log)
cat "$OUT/builds.txt"; echo; cat "$table"
