"""A workdir's worker start, phase by phase, in the order a pytest session goes through it: the judging process's steps beside the worker's, on one clock.

    python3 benchmarks/worker_start.py [WORKDIR] [--device cuda] [--ahead/--no-ahead]

With `--ahead` (the session's way) the worker is launched first and imports torch while this
process imports its own, checks the build and loads model.py; `--no-ahead` launches it where the
first item's set-up would (Worker.start's steps, in its order). Prints each step's end (seconds
since the start) and its own time, and when the worker's sandbox reply (its torch import, its
CUDA context) arrived, which this process waits for if it is not there yet.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.perf_counter()
STEPS: list[tuple[str, float, float]] = []


def step(name: str, action):
    started = time.perf_counter()
    result = action()
    STEPS.append((name, time.perf_counter() - T0, time.perf_counter() - started))
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workdir", nargs="?", default=".")
    p.add_argument("--device", default="cuda")
    p.add_argument("--ahead", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args()
    workdir = Path(args.workdir).resolve()

    from pytest_cudaopt.suite.session import CudaoptSession
    from pytest_cudaopt.suite.settings import Settings

    session = CudaoptSession(Settings({"device": args.device}), rootpath=workdir)
    replied: list[float] = []

    def launch():
        session.workers.launch(workdir)
        worker = session.workers.launched[workdir]
        # The reply's arrival, seen without reading it (the main thread takes it later).
        threading.Thread(target=lambda: worker.conn.poll(None) and replied.append(time.perf_counter() - T0),
                         daemon=True).start()

    if args.ahead:
        step("launch the worker (sandbox request sent)", launch)
    step("judge: import torch, bind the timing functions", lambda: __import__("pytest_cudaopt.suite.collection",
                                                                             fromlist=["x"]).bind_timing())
    build = step("judge: build checked", lambda: session.extension(workdir))
    from pytest_cudaopt.workdir import load_reference

    step("judge: model.py loaded", lambda: load_reference(workdir))
    if not args.ahead:
        step("launch the worker (sandbox request sent)", launch)
    from pytest_cudaopt import wire as protocol

    worker = session.workers.take_launched(workdir, build.so_path, args.device)
    protocol.setup_sharing()
    cuda = args.device.startswith("cuda")
    if cuda:
        from pytest_cudaopt.remote.window import JudgeWork

        work = step("judge: its CUDA context and the gate's own work", lambda: JudgeWork(args.device))
    step("worker: sandbox reply taken (waited for)", lambda: worker.confine(worker.receive(what="confining itself")))
    step("pings calibrated", worker.calibrate)
    if cuda:
        step("timed window set up and calibrated", lambda: worker.attach_stream_gate(work))
    arena = protocol.Arena.create()
    step("worker: workdir loaded", lambda: worker.request(
        {"op": "load", "workdir": str(workdir), "device": args.device, "extension": str(build.so_path),
         "arena": arena.path, "arena_bytes": arena.size}, what="loading the workdir"))
    arena.unlink()
    session.workers.stop()
    print(f"{'step':48s} {'ends at':>8s} {'took':>7s}")
    for name, at, took in STEPS:
        print(f"{name:48s} {at:7.2f}s {took:6.2f}s")
    print(f"the worker's sandbox reply arrived at {replied[0]:.2f}s" if replied else "no reply seen")
    return 0


if __name__ == "__main__":
    sys.exit(main())
