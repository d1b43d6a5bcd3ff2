"""Whether processes on one GPU wait on each other to start CUDA: N processes (torch imported) make their CUDA
context at the same moment; each's seconds to a context and a first kernel, against one alone. Then the same
small torch program under compute-sanitizer's tools, one process and N at once (the judge's memory-safety item
runs three such, one per tool, for every check on the GPU). With --phases: the memory-safety item's own child
setup (its tool flags and environment) under each tool alone and the three at once, each phase timed from the
child's start (torch imported, the context made, a copy, a kernel, the output back), its end as the parent sees it
(the tool's teardown) and its context's device memory.

    python benchmarks/context_contention.py [--counts 1 4 8 16] [--sanitizer-counts 1 3 12] [--out ctx.json]
    python benchmarks/context_contention.py --phases 2 [--out phases.json]
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


# --phases: one memory-safety child's phases, in seconds from its start (argv[1], time.time()).
PHASES = r"""
import json, os, subprocess, sys, time
t0 = float(sys.argv[1]); marks = {}
def mark(name): marks[name] = round(time.time() - t0, 3)
mark("python")
import torch
mark("torch imported")
torch.cuda.synchronize()
mark("context made")
try:   # the device memory this process holds with its context made (what a child started ahead would hold)
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=10).stdout.splitlines()
    marks["context MiB"] = next(int(a.split(",")[1]) for a in apps if int(a.split(",")[0]) == os.getpid())
except Exception:
    pass
t0 += time.time() - t0 - marks["context made"]   # the query's time left out of the later phases
x = torch.randn(1 << 20).to("cuda")
torch.cuda.synchronize()
mark("tensor copied")
y = x * 2 + 1
torch.cuda.synchronize()
mark("kernel ran")
y.cpu()
mark("output back")
print("PHASES " + json.dumps(marks), flush=True)
"""


def phases(tools: list[str], sanitizer: str, out: Path) -> list[dict]:
    """Children under `tools` ("none": no sanitizer) started together; each one's phases and its end."""
    from pytest_cudaopt.memsafety.verdict import TOOLS, child_environment

    procs = []
    for n, tool in enumerate(tools):
        under = [] if tool == "none" else [sanitizer, *TOOLS[tool], "--log-file", str(out / f"{tool}-{n}.log")]
        t0 = time.time()
        procs.append((tool, t0, subprocess.Popen([*under, sys.executable, "-c", PHASES, repr(t0)],
                                                  env=child_environment(), stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True)))
    rows = []
    for tool, t0, proc in procs:
        text, _ = proc.communicate()
        ended = round(time.time() - t0, 3)
        line = next((l for l in text.splitlines() if l.startswith("PHASES ")), None)
        phases = json.loads(line[len("PHASES "):]) if line else {"error": text[-400:]}
        rows.append({"tool": tool, "exit": proc.returncode, "phases": phases, "ended": ended})
    return rows


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


def _phases(repeat: int, out: Path) -> int:
    """--phases: each batch `repeat` times, the children's phases to `out` (JSON) and a table of medians."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pytest_cudaopt.memsafety.verdict import find_sanitizer

    sanitizer, where = find_sanitizer()
    if sanitizer is None:
        print(f"no compute-sanitizer on {where}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    batches = {f"{t} alone": [t] for t in ("none", "memcheck", "racecheck", "initcheck")}
    batches["the three at once"] = ["memcheck", "racecheck", "initcheck"]
    results: dict[str, list] = {}
    for label, tools in batches.items():
        for _ in range(repeat):
            results.setdefault(label, []).extend(phases(tools, sanitizer, out.parent))
    out.write_text(json.dumps(results, indent=1))
    names = ["python", "torch imported", "context made", "tensor copied", "kernel ran", "output back"]
    print(f"{'run':28s} " + " ".join(f"{n[:14]:>14s}" for n in names) + f" {'ended':>8s}  (s from start, medians)")
    for label, rows in results.items():
        for tool in dict.fromkeys(r["tool"] for r in rows):
            own = [r for r in rows if r["tool"] == tool and "error" not in r["phases"]]
            if not own:
                print(f"{label + ': ' + tool:28s} failed: {rows[0]['phases'].get('error', '')!r}")
                continue
            cells = [statistics.median(r["phases"][n] for r in own) for n in names]
            mib = [r["phases"]["context MiB"] for r in own if "context MiB" in r["phases"]]
            print(f"{label + ': ' + tool:28s} " + " ".join(f"{c:14.2f}" for c in cells)
                  + f" {statistics.median(r['ended'] for r in own):8.2f}"
                  + (f"  context {statistics.median(mib):.0f} MiB" if mib else ""))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--sanitizer-counts", type=int, nargs="+", default=[1, 3, 12])
    parser.add_argument("--out", default="context_contention.json")
    parser.add_argument("--phases", type=int, default=0, metavar="REPEAT", help="the memory-safety child's phases")
    args = parser.parse_args()
    if args.phases:
        return _phases(args.phases, Path(args.out))
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
