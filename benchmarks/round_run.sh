#!/usr/bin/env bash
# This round's GPU measurements in one device call, each step under a time limit, a summary last
# (and in $OUT/summary.txt); logs packed into $OUT/logs.tgz after every step.
#   git archive 87756e5 | tar -x -C .bench/before     # the tree before the round, once
#   OUT=/tmp/out BEFORE=.bench/before bash benchmarks/round_run.sh [STEP ...]
# Steps (default: all, in this order):
#   correct   benchmarks/values_timing_run.sh: the default workdir's correctness items in CORRECT_BEFORE's tree
#             and in this one, then the honest gallery kernels' correctness with value families
#   verdicts  benchmarks/verdicts_vs.sh BEFORE . : the default workdir's verdicts and their time, ROUNDS rounds
#   gallery   benchmarks/judge_gallery.py: the GPU gallery, pytest alone and `cudaopt judge`, verdicts side by side
#   gallery_before  BEFORE's own benchmarks/judge_gallery.py --arm judge: its gallery's verdicts in that tree
#   attacks_vs  benchmarks/attacks_vs.py BEFORE: the CPU attack workdirs judged by BEFORE's plugin and this one's
#   attacks   the attacks' GPU tests (tests/exploits -m gpu), tests/test_gpu_verdicts.py and tests/test_memsafety_gpu.py
#   shared    benchmarks/shared_gpu.sh over the gallery's workdirs at once (made here when the gallery step
#             did not run): blame when they crowd one GPU, the memory hog among them
#   service   benchmarks/judge_latency.py over the gallery at RATE workdirs an hour (p50/p95 latency), its timing settings
#             (RATE=half: half the rate step's, run before it)
#   rate      benchmarks/judge_gallery.py --arm judge --copies COPIES (default 3): the judge's steady rate, cold builds
#   warm      a throwaway rate step (one copy, ended at WARM_S, default 60): a fresh machine's first arm
#             ran 15-20% slower (benchmarks/results/2026-12-06-exits.md)
#   rate_tree the rate step in TREE's own checkout (another form of the judge, side by side with this one;
#             the arm run first on a fresh machine ran 15-20% slower on 2026-12-06: run a throwaway arm first
#             or alternate the arms, e.g. `rate rate_tree rate`)
#   rate_args the rate step with more pytest arguments, RATE_ARGS (e.g. "--cudaopt-warmup=0.05"), side by side
#   alone     the rate step with each perf stage alone on its GPU from its start (judge_gallery.py --no-turns)
#   profile   benchmarks/stage_profile.py: where one honest gallery workdir's check and perf stages spend their time
#             (PROFILE_ARGS="--turns --stages perf": the perf stage's time before and in its turn)
#   scaling   the rate step (COPIES default 1) at each --share of SHARES (default "1 2 4"): 1 to N workdirs at once
#   ahead     the rate step at each --ahead of AHEADS (default "0 4"): device stages starting up before their place
#   contention benchmarks/check_contention.py: N check sessions of one workdir at once (COUNTS, default "1 4 6"):
#             what shared checks wait on (busy cores, the GPU's utilisation)
#   replay    benchmarks/schedule_replay.py over the rate step's lines (CPU): its replay error, and --share 4 and 8
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
summary="$OUT/summary.txt"; : > "$summary"
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-10s rc=%-3s %5d.%01d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) >> "$summary"
  for f in "$LOGS/$name"/judge.jsonl "$LOGS/$name"/judge_gallery.{json,txt}; do   # small, and always back
    [ -f "$f" ] && mkdir -p "$OUT/$name" && cp "$f" "$OUT/$name/"; done
  pack
}
pack() {  # the logs without the workdirs' copies and builds (the device returns files of a bounded size)
  tar czf "$OUT/logs.tgz" -C "$LOGS" --exclude='*/work' --exclude='*.so' --exclude='*.o' --exclude='*/objects' . \
    2>/dev/null
}
fresh() {  # fresh NAME: NAME, or NAME_2, NAME_3, ... when a step of that name ran already (arms alternated)
  local name=$1 n=1; while [ -e "$LOGS/$name" ] || [ -e "$LOGS/$name.log" ]; do n=$((n + 1)); name=$1_$n; done
  echo "$name"
}
gallery() {  # gallery FOLDER: the GPU gallery's workdirs (made by the gallery step, else here)
  [ -d "$1" ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path; import judge_gallery; judge_gallery.gpu_gallery(Path(sys.argv[1]))" "$1"
}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > "$LOGS/gpu.txt" 2>&1
for name in ${@:-correct verdicts gallery attacks shared service}; do case $name in
  correct)  OUT="$LOGS/correct" BEFORE="${CORRECT_BEFORE:-}" SKIP_SHAVE=1 SKIP_TESTS=1 step correct 420 \
              bash benchmarks/values_timing_run.sh ;;
  verdicts) OUT="$LOGS/verdicts" ROUNDS="${ROUNDS:-2}" step verdicts 420 bash benchmarks/verdicts_vs.sh \
              ${BEFORE:+"$BEFORE"} . ;;
  gallery)  step gallery "${GALLERY_S:-420}" python3 benchmarks/judge_gallery.py --out "$LOGS/gallery" ;;
  gallery_before) before=$(cd "$BEFORE" && pwd)
            step gallery_before "${GALLERY_S:-420}" env PYTHONPATH="$before" \
              python3 "$before/benchmarks/judge_gallery.py" --arm judge --out "$LOGS/gallery_before" ;;
  attacks_vs) step attacks_vs 600 python3 benchmarks/attacks_vs.py "$BEFORE" --out "$LOGS/attacks_vs" ;;
  attacks)  step attacks "${ATTACKS_S:-300}" python3 -m pytest tests/exploits tests/test_gpu_verdicts.py tests/test_memsafety_gpu.py -m gpu -q \
              -p no:cacheprovider -rA ;;
  shared)   gallery "$LOGS/gallery/work/pytest"
            OUT="$LOGS/shared" step shared "${SHARED_S:-300}" bash benchmarks/shared_gpu.sh "$LOGS"/gallery/work/pytest/*/ ;;
  service)  gallery "$LOGS/gallery/work/pytest"
            rate=${RATE:-500}; [ "$rate" = half ] && rate=$(python3 -c "import json, sys   # half the rate step's
d = json.load(open(sys.argv[1]))['judge']; print(round(len(d['results']) * 1800 / d['wall_s']))" \
              "$LOGS/rate/judge_gallery.json" || echo 500)
            step service "${SERVICE_S:-420}" python3 benchmarks/judge_latency.py "$LOGS/gallery/work/pytest" \
              --per-hour "$rate" --count "${COUNT:-36}" --out "$LOGS/service.json" -- \
              $(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import judge_gallery; print(*judge_gallery.GPU_ARGS)") ;;
  rate)     at=$(fresh rate); step "$at" "${RATE_S:-420}" python3 benchmarks/judge_gallery.py --arm judge \
              --copies "${COPIES:-3}" --out "$LOGS/$at" ;;
  warm)     step warm "${WARM_S:-60}" python3 benchmarks/judge_gallery.py --arm judge --copies 1 --out "$LOGS/warm" ;;
  rate_tree) tree=$(cd "$TREE" && pwd)   # run from the tree: its zygote must import the tree's package, not this one
            at=$(fresh rate_tree)
            (cd "$tree" && step "$at" "${RATE_S:-420}" env PYTHONPATH="$tree" python3 benchmarks/judge_gallery.py \
              --arm judge --copies "${COPIES:-3}" --out "$LOGS/$at") ;;
  alone)    step alone "${RATE_S:-420}" python3 benchmarks/judge_gallery.py --arm judge --no-turns \
              --copies "${COPIES:-3}" --out "$LOGS/alone" ;;
  rate_args) step rate_args "${RATE_S:-420}" python3 benchmarks/judge_gallery.py --arm judge --copies "${COPIES:-3}" \
              $(for a in ${RATE_ARGS:-}; do printf -- '--pytest-arg=%s ' "$a"; done) --out "$LOGS/rate_args" ;;
  scaling)  for n in ${SHARES:-1 2 4}; do step "scaling_$n" "${RATE_S:-420}" python3 benchmarks/judge_gallery.py \
              --arm judge --copies "${COPIES:-1}" --share "$n" --out "$LOGS/scaling_$n"; done ;;
  ahead)    for n in ${AHEADS:-0 4}; do mkdir -p "$LOGS/ahead_$n"
              step "ahead_$n" "${RATE_S:-420}" python3 benchmarks/cpu_sampler.py --out "$LOGS/ahead_$n/cpu.json" -- \
              python3 benchmarks/judge_gallery.py --arm judge --copies "${COPIES:-3}" --ahead "$n" \
              ${PYTEST_ARGS:+$(for a in $PYTEST_ARGS; do printf -- '--pytest-arg=%s ' "$a"; done)} \
              --out "$LOGS/ahead_$n"; done ;;
  replay)   step replay 60 python3 benchmarks/schedule_replay.py "$LOGS/rate/judge.jsonl" --share 4 8 \
              --measured "$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['judge']['wall_s'])" \
              "$LOGS/rate/judge_gallery.json")" ;;
  contention) step contention "${CONTENTION_S:-300}" python3 benchmarks/check_contention.py --counts ${COUNTS:-1 4 6} \
              --out "$LOGS/contention" ;;
  profile)  step profile "${PROFILE_S:-300}" python3 benchmarks/stage_profile.py --problem "${PROBLEM:-gelu}" \
              ${PROFILE_ARGS:-} --out "$LOGS/profile" ;;
  *) echo "unknown step: $name" >&2; exit 2 ;;
esac; done
{ cat "$LOGS/gpu.txt"; echo; cat "$summary"; echo
  cat "$LOGS/correct/summary.txt" 2>/dev/null; echo
  tail -n 12 "$LOGS/verdicts/table.txt" 2>/dev/null; echo
  cat "$LOGS/gallery_before/judge_gallery.txt" 2>/dev/null | tail -n 30; echo
  cat "$LOGS/gallery/judge_gallery.txt" 2>/dev/null | tail -n 30; echo
  for f in "$LOGS"/rate/judge_gallery.txt "$LOGS"/rate_[0-9]*/judge_gallery.txt "$LOGS"/rate_tree*/judge_gallery.txt; do
    [ -f "$f" ] && { echo "$f"; grep -E "workdirs/hour|by stage|perf turns|in its place|judged again|verdicts:" "$f"; }; done; echo
  tail -n 6 "$LOGS/rate_args/judge_gallery.txt" 2>/dev/null; echo
  tail -n 7 "$LOGS/alone/judge_gallery.txt" 2>/dev/null; echo
  for f in "$LOGS"/scaling_*/judge_gallery.txt "$LOGS"/ahead_*/judge_gallery.txt; do [ -f "$f" ] && { echo "$f"
    grep -E "workdirs/hour|by stage|perf turns|in its place|judged again|verdicts:" "$f"; }; done; echo
  for f in "$LOGS"/ahead_*/cpu.json; do [ -f "$f" ] && python3 -c "import json, sys
d = json.load(open(sys.argv[1])); d.pop('timeline'); d.pop('gpu'); print(sys.argv[1], json.dumps(d))" "$f"; done; echo
  cat "$LOGS/replay.log" 2>/dev/null; echo
  grep -E "^(built|check|correctness|memsafety)" "$LOGS/contention.log" 2>/dev/null; echo
  head -n 30 "$LOGS/profile/perf.txt" 2>/dev/null; echo
  tail -n 1 "$LOGS/attacks_vs/table.txt" 2>/dev/null; echo
  tail -n 4 "$LOGS/attacks.log" 2>/dev/null; echo
  tail -n 20 "$LOGS/shared.log" 2>/dev/null; echo
  tail -n 25 "$LOGS/service.log" 2>/dev/null; } | tee "$OUT/report.txt"
pack
