#!/usr/bin/env bash
# A new user's first hour on the CPU with KernelBench's own sizes: level1/93_masked_cumsum and
# level2/68_Matmul_Min_Subtract as published, each made a workdir with `cudaopt init --device cpu`,
# given the honest C++ kernels of benchmarks/workdirs/first_hour/, and judged (-m correctness); then
# shrunk (model.py's constants edited, the lock recorded again) and judged again. Wall times and
# each item's seconds (harness_seconds beside them) go to $OUT/summary.txt.
#   bash benchmarks/first_hour_cpu.sh PATH/TO/KernelBench/KernelBench [OUT]
set -uo pipefail
KB=$(cd "$1" && pwd); OUT=$(mkdir -p "${2:-$PWD/first-hour-out}" && cd "${2:-$PWD/first-hour-out}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
summary="$OUT/summary.txt"; : > "$summary"
export PYTHONUNBUFFERED=1

setup() {  # setup NAME MODEL FORWARD: a workdir around KernelBench's model.py, with our kernels
  local name=$1 model=$2 forward=$3
  cudaopt init "$WORK/$name" --model "$KB/$model" --device cpu 2>&1 | tee "$OUT/$name-init.log"
  rm -f "$WORK/$name"/kernels/starter*
  cp "$HERE/workdirs/first_hour/$name/kernels/"* "$WORK/$name/kernels/"
  python3 - "$WORK/$name/model_new.py" "$forward" <<'PY'
import sys
path, forward = sys.argv[1:]
text = open(path).read()
cut = text.index("        raise NotImplementedError(")
open(path, "w").write(text[:cut] + f"        return {forward}\n")
PY
  cudaopt build "$WORK/$name" > "$OUT/$name-build.log" 2>&1
}

judge() {  # judge NAME TAG: -m correctness with the JSON report, wall time into the summary
  local name=$1 tag=$2 t0; t0=$(date +%s)
  timeout 1500 python3 -m pytest "$WORK/$name" -m correctness -p no:randomly -p no:cacheprovider \
    --cudaopt-report="$OUT/$name-$tag.json" > "$OUT/$name-$tag.log" 2>&1; local rc=$?
  printf '%-22s %-10s rc=%-3s %5d s\n' "$name" "$tag" "$rc" $(( $(date +%s) - t0 )) >> "$summary"
  python3 - "$OUT/$name-$tag.json" >> "$summary" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["results"]:
    d = r["data"]
    first = (d.get("message") or "").splitlines()[:1]
    print(f"    {d['case']:<26} {'pass' if d['passed'] else 'FAIL':<5} {d['seconds']:7.1f} s "
          f"(harness {d.get('harness_seconds', 0):6.1f} s) {first[0][:150] if first else ''}")
PY
}

shrink() {  # shrink NAME 'a=1' 'b=2' ...: model.py's constants edited, the lock recorded again
  local name=$1; shift
  python3 - "$WORK/$name/model.py" "$@" <<'PY'
import re, sys
path, *pairs = sys.argv[1:]
text = open(path).read()
for pair in pairs:
    key, value = pair.split("=", 1)
    text = re.sub(rf"^{re.escape(key)} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
open(path, "w").write(text)
PY
  cudaopt init --lock-only "$WORK/$name" > /dev/null
}

setup masked_cumsum level1/93_masked_cumsum.py "cuda_extension.masked_cumsum(x, mask, self.dim)"
judge masked_cumsum published
shrink masked_cumsum "batch_size=128" "input_shape=(4000,)"
judge masked_cumsum shrunk
setup matmul_min_subtract level2/68_Matmul_Min_Subtract.py \
  "cuda_extension.linear_min_sub(x, self.linear.weight, self.linear.bias, self.constant)"
judge matmul_min_subtract published
shrink matmul_min_subtract "in_features=1024" "out_features=1024"
judge matmul_min_subtract shrunk
cat "$summary"
rm -rf "$WORK"
