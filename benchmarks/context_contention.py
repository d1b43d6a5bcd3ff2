"""Whether processes on one GPU wait on each other to start CUDA: N processes (torch imported) make their CUDA
context at the same moment; each's seconds to a context and a first kernel, against one alone. Then the same
small torch program under compute-sanitizer's tools, one process and N at once (the judge's memory-safety item
runs three such, one per tool, for every check on the GPU).

    python benchmarks/context_contention.py [--counts 1 4 8 16] [--sanitizer-counts 1 3 12] [--out ctx.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Waits for the start file, then times its context and a first kernel; prints the seconds.
CONTEXT = """
import os, sys, time
import torch
start = sys.argv[1]
open(start + ".ready." + str(os.getpid()), "w").close()
while not os.path.exists(start):
    time.sleep(0.001)
t = time.perf_counter()
x = torch.ones(1 << 20, device="cuda")
(x * 2).sum().item()
print(time.perf_counter() - t)
"""

# What a sanitized case does, roughly: torch, a context, a few kernels (times: import, then CUDA).
SANITIZED = """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
x = torch.randn(1 << 16, device="cuda")
y = torch.nn.functional.gelu(x) * 2 + 1
y.sum().item()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def contexts(count: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="ctx-"))
    start = str(folder / "go")
    procs = [subprocess.Popen([sys.executable, "-c", CONTEXT, start], stdout=subprocess.PIPE, text=True)
             for _ in range(count)]
    while len(list(folder.glob("go.ready.*"))) < count:
        time.sleep(0.01)
    began = time.perf_counter()
    Path(start).touch()
    seconds = [float(p.communicate()[0].split()[-1]) for p in procs]
    wall = time.perf_counter() - began
    shutil.rmtree(folder, ignore_errors=True)
    return {"count": count, "median_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3),
            "wall_s": round(wall, 3)}


def sanitized(count: int, tool: str, sanitizer: str) -> dict:
    began = time.perf_counter()
    procs = [subprocess.Popen([sanitizer, "--tool", tool, "--print-limit", "1", sys.executable, "-c", SANITIZED],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(count)]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - began
    pairs = []
    for out in outs:
        numbers = [line.split() for line in out.splitlines() if len(line.split()) == 2]
        try:
            pairs.append(tuple(float(x) for x in numbers[-1]))
        except (IndexError, ValueError):
            pass
    return {"tool": tool, "count": count, "wall_s": round(wall, 2),
            "import_s": round(statistics.median(p[0] for p in pairs), 2) if pairs else None,
            "cuda_s": round(statistics.median(p[1] for p in pairs), 2) if pairs else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--sanitizer-counts", type=int, nargs="+", default=[1, 3, 12])
    parser.add_argument("--out", default="context_contention.json")
    args = parser.parse_args()
    found: dict = {"contexts": [], "sanitized": [], "plain": []}
    for count in args.counts:
        found["contexts"].append(contexts(count))
        print("contexts at once", found["contexts"][-1], flush=True)
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    for count in args.sanitizer_counts:
        began = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", SANITIZED], stdout=subprocess.PIPE, text=True)
                 for _ in range(count)]
        outs = [p.communicate()[0].split() for p in procs]
        found["plain"].append({"count": count, "wall_s": round(time.perf_counter() - began, 2),
                               "import_s": statistics.median(float(o[0]) for o in outs),
                               "cuda_s": statistics.median(float(o[1]) for o in outs)})
        print("plain", found["plain"][-1], flush=True)
        if os.path.exists(sanitizer):
            for tool in ("memcheck", "racecheck", "initcheck"):
                found["sanitized"].append(sanitized(count, tool, sanitizer))
                print("sanitized", found["sanitized"][-1], flush=True)
    Path(args.out).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
