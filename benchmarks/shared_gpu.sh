#!/usr/bin/env bash
# Several pytest sessions of different workdirs on one GPU at once: whose fault each failure is
# when they crowd each other (blame: candidate, environment or harness; exit 75 the environment's,
# 70 the harness's). Prints one row per workdir: passed, complete, blame, exit code.
#
#   bash benchmarks/shared_gpu.sh WORKDIR [WORKDIR...]
#
# Environment: PYTHON (default python3), GPU (the device index all sessions share; default 0),
# OUT (reports and logs; default a new temporary folder), PYTEST_ARGS (more pytest arguments,
# e.g. "-m correctness").
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: shared_gpu.sh WORKDIR [WORKDIR...]" >&2
  exit 2
fi
py=${PYTHON:-python3}
# pytest_cudaopt from this checkout, uninstalled (as on the GPU image)
export PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-$(mktemp -d -t cudaopt-shared-gpu.XXXXXX)}
mkdir -p "$out"
read -r -a extra <<< "${PYTEST_ARGS:-}"
# the plugin by -p where no entry point loads it (an uninstalled checkout)
read -r -a plugin <<< "$("$py" -c 'from pytest_cudaopt.launch import plugin_args; print(" ".join(plugin_args()))')"
pids=()
names=()
for i in $(seq 1 $#); do
  workdir=$(cd "${!i}" && pwd)
  names+=("$workdir")
  # Every session on the same device, started together.
  CUDA_VISIBLE_DEVICES=${GPU:-0} "$py" -m pytest "$workdir/model_new.py" --rootdir "$workdir" -p no:cacheprovider \
    "${plugin[@]}" "--cudaopt-report=$out/report-$i.json" "${extra[@]}" > "$out/log-$i.txt" 2>&1 &
  pids+=($!)
done
codes=()
for pid in "${pids[@]}"; do
  code=0
  wait "$pid" || code=$?
  codes+=("$code")
done
printf '%-50s %-7s %-9s %-12s %s\n' workdir passed complete blame exit
for i in "${!names[@]}"; do
  n=$((i + 1))
  "$py" - "$out/report-$n.json" "${names[$i]}" "${codes[$i]}" <<'PY'
import json, sys

path, workdir, code = sys.argv[1:4]
try:
    with open(path) as handle:
        doc = json.load(handle)
    row = (str(doc.get("passed")).lower(), str(doc.get("complete")).lower(), doc.get("blame") or "-")
except (OSError, ValueError):
    row = ("-", "-", "no report")
print(f"{workdir[-50:]:<50} {row[0]:<7} {row[1]:<9} {row[2]:<12} {code}")
PY
done
echo "reports and logs: $out"
