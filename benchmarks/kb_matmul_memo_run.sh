#!/usr/bin/env bash
# KernelBench level1/1 (N = 4096) with a deliberately naive GEMM behind a memo keyed by sampled input
# content (benchmarks/workdirs/kb_matmul_memo): the correctness verdict passes (its outputs are right),
# the perf verdict must time it at its honest speed and fail the gate. Logs and JSON under $OUT.
#   OUT=/tmp/out bash benchmarks/kb_matmul_memo_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
WORK="${WORK:-$(mktemp -d)}/kb_matmul_memo"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$WORK"; mkdir -p "$WORK"
cp -r benchmarks/workdirs/kb_matmul_memo/. "$WORK/"
cp pytest_cudaopt/templates/binding.cpp pytest_cudaopt/templates/binding_registry.h "$WORK/"
cd "$WORK"
timeout 900 python3 -m pytest model_new.py -p pytest_cudaopt.plugin -p no:cacheprovider -m "correctness or perf" \
  --cudaopt-profile=ci --cudaopt-max-examples=5 --cudaopt-report="$OUT/kb_matmul_memo.json" -rA ${ARGS:-} \
  > "$OUT/kb_matmul_memo.log" 2>&1
echo "rc=$?"
grep -E "ModelNew \(custom\)|gate:|timing:|passed|failed" "$OUT/kb_matmul_memo.log" | tail -n 12
