"""Where a host's CPU time goes while a command runs: every process's CPU seconds (/proc/PID/stat), summed by what
it is (nvcc, a stage's pytest child, a candidate's worker, compute-sanitizer, ...), the host's busy cores each
second, and the GPU's utilisation (nvidia-smi) beside them. Linux only.

    python benchmarks/cpu_sampler.py --out cpu.json -- python benchmarks/judge_gallery.py --arm judge ...

The command runs to its end; then the summary is printed and written to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
# (category, a substring of the command line), first match wins
KINDS = [("compute-sanitizer", "compute-sanitizer"), ("sanitized case", "pytest_cudaopt.candidate.sanitized"),
         ("worker", "pytest_cudaopt.candidate"), ("inductor compile", "compile_worker"),
         ("inductor compile", "torch._inductor"), ("nvcc", "nvcc"), ("nvcc", "cicc"), ("nvcc", "ptxas"),
         ("nvcc", "cudafe"), ("nvcc", "fatbinary"), ("nvcc", "nvlink"), ("c++", "cc1plus"), ("c++", "/ld"),
         ("c++", "collect2"), ("ninja", "ninja"), ("build child", "child_build"), ("zygote", "run.zygote"),
         ("sentinel", "run.sentinel"), ("check child", "not perf and not policy"), ("perf child", "-m perf"),
         ("policy child", "-m policy"), ("judge", "judge_gallery"), ("judge", "cudaopt")]


# A zygote's fork keeps the zygote's command line: what its output goes to says what it is.
LOGS = {"check.log": "check child", "perf.log": "perf child", "build.log": "build child", "policy.log": "policy child",
        "worker.log": "worker"}


def kind_of(pid: str, cmdline: str) -> str:
    try:
        out = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        out = ""
    by_log = LOGS.get(out.rsplit("/", 1)[-1])
    return by_log or next((kind for kind, mark in KINDS if mark in cmdline), "other")


def _cpu(pid: str) -> tuple[float, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK, cmd   # utime + stime


def _busy() -> tuple[float, float]:
    parts = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="cpu.json")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    gpu = None
    if shutil.which("nvidia-smi"):
        gpu = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                "-lms", "500"], stdout=subprocess.PIPE, text=True)
    proc = subprocess.Popen(command)
    seen: dict[str, tuple[float, str]] = {}     # pid -> (CPU seconds at the last sample, its kind)
    by_kind: dict[str, float] = {}
    timeline: list[float] = []                   # busy cores per sample
    last_busy, last_total = _busy()
    cores = os.cpu_count() or 1
    started = time.monotonic()
    while True:
        done = proc.poll() is not None
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            got = _cpu(pid)
            if got is None:
                continue
            now, cmd = got
            before, kind = seen.get(pid) or (0.0, kind_of(pid, cmd))
            if pid not in seen and time.monotonic() - started > args.every * 2:
                before = 0.0   # born since the last sample: all its time is in the run
            elif pid not in seen:
                before = now   # there before the command: only what it spends from now
            by_kind[kind] = by_kind.get(kind, 0.0) + max(0.0, now - before)
            seen[pid] = (now, kind)
        busy, total = _busy()
        timeline.append(cores * (busy - last_busy) / max(total - last_total, 1e-9))
        last_busy, last_total = busy, total
        if done:
            break
        time.sleep(args.every)
    wall = time.monotonic() - started
    util: list[int] = []
    if gpu is not None:
        gpu.terminate()
        util = [int(x) for x in gpu.communicate()[0].split() if x.strip().isdigit()]
    ordered = sorted(timeline)
    summary = {"wall_s": round(wall, 1), "cores": cores,
               "cpu_s_by_kind": {k: round(v, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
               "cpu_s": round(sum(by_kind.values()), 1),
               "busy_cores_mean": round(sum(timeline) / max(len(timeline), 1), 2),
               "busy_cores_p50": round(ordered[len(ordered) // 2], 2) if ordered else None,
               "seconds_over_90pct_busy": round(args.every * sum(c > 0.9 * cores for c in timeline), 1),
               "gpu_util_mean": round(sum(util) / len(util), 1) if util else None,
               "gpu_util_seconds_at_0": round(0.5 * sum(u == 0 for u in util), 1) if util else None}
    Path(args.out).write_text(json.dumps({**summary, "timeline": [round(c, 2) for c in timeline], "gpu": util}))
    print(json.dumps(summary, indent=1))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
