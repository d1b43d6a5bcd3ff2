#!/usr/bin/env bash
# The CI gate, the same on a GPU runner and by hand on a GPU machine (nothing needs installing
# beyond torch, pytest, pytest-benchmark, hypothesis, ninja and pybind11):
#   .github/scripts/gate.sh CANDIDATE [BASELINE] [-- PYTEST_ARGS...]
# CANDIDATE: the pull request's workdir. BASELINE: a checkout of the target branch; its ModelNew is
# timed beside the candidate's (regression check), and its pytest_cudaopt is the judge, because the
# candidate's checkout could change the plugin itself.
# Environment: GATE_OUT (report.json, junit.xml, summary.md; default ./cudaopt-gate), GATE_BENCHMARKS
# (root of the pytest-benchmark history; default ./.benchmarks), GATE_GPU_KIND (the history's key;
# default the GPU's name), GATE_ARGS (more `cudaopt gate` options, e.g. "--regression-margin 0.05"),
# PYTHON (default python3), GATE_ATTEMPTS (runs of the gate while it exits 75, the environment's
# fault: a busy device, memory held by others; default 1). $GITHUB_STEP_SUMMARY, when set, receives
# the Markdown summary.
# Exit code: cudaopt gate's: 0 passed, 1 a verdict failed, 2 bad arguments, 3 broken setup (no GPU),
# 70 the harness's fault, 75 the environment's (after GATE_ATTEMPTS runs).
set -euo pipefail
usage="usage: gate.sh CANDIDATE [BASELINE] [-- PYTEST_ARGS...]"
candidate=$(cd "${1:?$usage}" && pwd); shift
baseline=""
if [[ $# -gt 0 && $1 != "--" ]]; then baseline=$(cd "$1" && pwd); shift; fi
if [[ $# -gt 0 && $1 == "--" ]]; then shift; fi
py=${PYTHON:-python3}
# The judge: GATE_JUDGE (a folder holding pytest_cudaopt/), else the target branch's checkout, else
# the candidate's, else the installed package.
judge=${GATE_JUDGE:-}
if [[ -z $judge ]]; then
  for dir in "$baseline" "$candidate"; do
    if [[ -n $dir && -d $dir/pytest_cudaopt ]]; then judge=$dir; break; fi
  done
fi
out=${GATE_OUT:-$PWD/cudaopt-gate}
mkdir -p "$out"; out=$(cd "$out" && pwd)
kind=${GATE_GPU_KIND:-$("$py" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no-gpu")' 2>/dev/null || echo unknown)}
kind=$(printf '%s' "$kind" | tr -c 'A-Za-z0-9._-' '_')
storage=${GATE_BENCHMARKS:-$PWD/.benchmarks}/$kind
mkdir -p "$storage"; storage=$(cd "$storage" && pwd)
args=(gate "$candidate" --out "$out")
if [[ -n $baseline ]]; then args+=(--baseline-workdir "$baseline"); fi
read -r -a extra <<< "${GATE_ARGS:-}"
args+=("${extra[@]}" -- --benchmark-autosave "--benchmark-storage=file://$storage" "$@")
echo "gate.sh: judge ${judge:-the installed pytest_cudaopt}, GPU kind $kind, history $storage, out $out"
# `python -m` puts the current folder first on sys.path: the judge's pytest_cudaopt is the one
# imported, installed or not (the plugin then loads with -p; the candidate's conftest.py sees it
# loaded and does not load its own).
if [[ -n $judge ]]; then
  cd "$judge"
  export PYTHONPATH="$judge${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
attempts=${GATE_ATTEMPTS:-1}
for ((attempt = 1; ; attempt++)); do
  status=0
  "$py" -m pytest_cudaopt.cli "${args[@]}" || status=$?
  if [[ $status -ne 75 || $attempt -ge $attempts ]]; then exit "$status"; fi
  echo "gate.sh: attempt $attempt of $attempts ended with 75: the environment, not the candidate, failed it; again"
done
