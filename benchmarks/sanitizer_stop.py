"""Whether compute-sanitizer's children survive being stopped and continued as a paused check's are
(`Workers.hold`: SIGSTOP, then SIGCONT, to each child's process group), under each tool, on the GPU.

    python3 benchmarks/sanitizer_stop.py [--cycles 40] [--every 0.2] [--limit 90]

Each tool runs a Python that launches small kernels for a few seconds, in a session of its own; the group is
stopped and continued every `--every` seconds. Printed per tool: how its target is related to the sanitizer
(process group, TracerPid), the cycles sent, whether it ended within `--limit` and its exit code, and each
process's state when it did not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

WORK = """
import time, torch
x = torch.randn(1 << 20, device="cuda")
end = time.time() + {seconds}
while time.time() < end:
    x = x * 1.0001 + 0.5
    torch.cuda.synchronize()
print("done", float(x[0]))
"""


def _status(pid: int) -> str:
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return f"{pid}: gone"
    return (f"{pid} {fields.get('Name', '').strip()}: state {fields.get('State', '').strip()}, "
            f"tracer {fields.get('TracerPid', '').strip()}, pgid {os.getpgid(pid)}, wchan {wchan}")


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--limit", type=float, default=90.0)
    parser.add_argument("--seconds", type=float, default=6.0, help="the target's own work, unstopped")
    args = parser.parse_args()
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    procs = {tool: subprocess.Popen([sanitizer, "--tool", tool, sys.executable, "-c",
                                     WORK.format(seconds=args.seconds)], start_new_session=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for tool in ("memcheck", "racecheck", "initcheck")}
    time.sleep(3.0)
    for tool, proc in procs.items():
        print(f"{tool}: " + "; ".join(_status(p) for p in _tree(proc.pid)))
    sent = 0
    for _ in range(args.cycles):
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(args.every / 2)
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
        sent += 1
        time.sleep(args.every / 2)
    hung = 0
    deadline = time.monotonic() + args.limit
    for tool, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            print(f"{tool}: {sent} stop/continue cycles, exit {proc.returncode}, last line: "
                  f"{(out.strip().splitlines() or [''])[-1][:160]}")
        except subprocess.TimeoutExpired:
            hung += 1
            print(f"{tool}: {sent} cycles, NOT ENDED within {args.limit:.0f} s: "
                  + "; ".join(_status(p) for p in _tree(proc.pid)))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return 1 if hung else 0


if __name__ == "__main__":
    sys.exit(main())
