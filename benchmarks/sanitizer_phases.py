"""Where a memory-safety child's time goes: a Python child run under each of compute-sanitizer's tools (and under
none), as the memory-safety item runs its children (the same tool flags and environment), timing its phases from
its own start: torch imported, the CUDA context made, a tensor copied to the device, an elementwise kernel, the
output back; then the process's end as the parent sees it (the tool's teardown). Alone, then the three tools at once.

    python3 benchmarks/sanitizer_phases.py [--repeat 2] [--out DIR]      # GPU host
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
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


def run(tools: list[str], sanitizer: str, out: Path) -> list[dict]:
    """Children under `tools` ("none": no sanitizer) started together; each one's phases and its end."""
    from pytest_cudaopt.memsafety.verdict import TOOLS, child_environment

    procs = []
    for n, tool in enumerate(tools):
        under = [] if tool == "none" else [sanitizer, *TOOLS[tool], "--log-file", str(out / f"{tool}-{n}.log")]
        t0 = time.time()
        procs.append((tool, t0, subprocess.Popen([*under, sys.executable, "-c", CHILD, repr(t0)],
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("out"))
    opts = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from pytest_cudaopt.memsafety.verdict import find_sanitizer

    sanitizer, where = find_sanitizer()
    if sanitizer is None:
        print(f"no compute-sanitizer on {where}", file=sys.stderr)
        return 2
    opts.out.mkdir(parents=True, exist_ok=True)
    batches = {f"{t} alone": [t] for t in ("none", "memcheck", "racecheck", "initcheck")}
    batches["the three at once"] = ["memcheck", "racecheck", "initcheck"]
    results: dict[str, list] = {}
    for label, tools in batches.items():
        for _ in range(opts.repeat):
            results.setdefault(label, []).extend(run(tools, sanitizer, opts.out))
    (opts.out / "sanitizer_phases.json").write_text(json.dumps(results, indent=1))
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


if __name__ == "__main__":
    sys.exit(main())
