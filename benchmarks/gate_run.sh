#!/usr/bin/env bash
# The CI gate's own script (.github/scripts/gate.sh) on a GPU machine, from the checkout:
#   (a) the default workdir against a copy of itself as the target branch: passes, the two
#       ModelNew rows within about 2% of each other;
#   (b) a deliberately slowed candidate (c_proj's GEMM run twice, the first result dropped:
#       about 20% slower on the whole layer, still correct) against the default: fails on the
#       regression check (exit 1).
# Logs, reports and summaries under $OUT (default ./out); a short table last.
#   bash benchmarks/gate_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
timeout 300 bash utils/compile.sh > "$OUT/gate_build.log" 2>&1; echo "build rc=$?" >> "$OUT/gate_build.log"
copy() {  # copy DEST: the checkout (with its built extension, which is relocatable) without .git and logs
  mkdir -p "$1"
  tar --exclude=./.git --exclude=./out --exclude=./cudaopt-gate --exclude=./.benchmarks -cf - . | tar -xf - -C "$1"
}
copy "$work/target"
copy "$work/slow"
sed -i 's/^\( *\)return cuda_extension.linear(y, self.c_proj.weight, self.c_proj.bias)$/\1cuda_extension.linear(y, self.c_proj.weight, self.c_proj.bias)  # deliberately slow\n&/' \
  "$work/slow/model_new.py"
grep -q "deliberately slow" "$work/slow/model_new.py" || echo "gate_run.sh: could not patch model_new.py" >&2
run() {  # run NAME CANDIDATE BASELINE
  local name=$1 t0; t0=$(date +%s)
  GATE_OUT="$OUT/gate_$name" GATE_BENCHMARKS="$OUT/benchmarks" timeout 280 \
    bash "$root/.github/scripts/gate.sh" "$2" "$3" -- -p no:randomly > "$OUT/gate_$name.log" 2>&1
  local rc=$?
  printf '%-8s exit=%-3s %4d s  %s\n' "$name" "$rc" $(( $(date +%s) - t0 )) \
    "$(grep -h -o 'regression check: .*' "$OUT/gate_$name/summary.md" 2>/dev/null | head -1)" >> "$OUT/gate_table.txt"
}
: > "$OUT/gate_table.txt"
run self "$root" "$work/target"    # expect exit 0
run slowed "$work/slow" "$root"    # expect exit 1 (regression)
for name in self slowed; do
  echo "== $name: $OUT/gate_$name/summary.md"; grep -E '^\| (Model|torch|peer|ModelNew)' "$OUT/gate_$name/summary.md" || tail -n 20 "$OUT/gate_$name.log"
done
echo; echo "expected: self exit=0 (ratio within 0.98-1.02), slowed exit=1 (ratio > 1.03)"
cat "$OUT/gate_table.txt"
