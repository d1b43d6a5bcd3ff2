"""The worker's cost on the timed figure: a workdir's ModelNew timed in-process and through its worker, side by side in one engine run (CUDA events, L2 flushed, fresh inputs per call).

    python benchmarks/bench_worker.py WORKDIR [WORKDIR ...] [--max-time 10]

Prints, per workdir, the two device-time medians and their ratio (worker / in-process), and the
latency medians (the latency includes the worker's round trip by design). The in-process model
is loaded only here, for the comparison: the harness itself never loads it in the judging process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_cudaopt import build  # noqa: E402
from pytest_cudaopt.perf import clocks, engine  # noqa: E402
from pytest_cudaopt.perf.feed import Feed  # noqa: E402
from pytest_cudaopt.workdir import load_reference, load_workdir  # noqa: E402
from pytest_cudaopt.worker import Worker  # noqa: E402


def bench(path: Path, max_time: float) -> tuple[str, float, float, float, float]:
    device = "cuda"
    result = build.build(path)
    local = load_workdir(path, result.module)
    worker = Worker(path, result.so_path, device).start()
    try:
        remote = load_reference(path, worker)
        model, inproc = local.make_models(device, seed=1)
        _, through = remote.make_models(device, seed=1)

        def draw(n: int) -> list:
            with worker.sharing():
                return remote.inputs(1000 + n, device, isolated=False)

        contenders = [engine.Contender("in-process", inproc), engine.Contender("worker", through, every_call=True)]
        config = engine.Config(max_time=max_time, warmup=0.5, target_rse=0.002, min_runs=200)
        def compare(output, expected):
            return None if torch.allclose(output, expected, atol=1e-4, rtol=1e-4) else "mismatch"

        with torch.no_grad():
            found = engine.measure(contenders, Feed(draw, lambda *a: model(*a)), clock=clocks.CudaClock(device),
                                   config=config, compare=compare)
        a, b = found["in-process"], found["worker"]
        for r in (a, b):
            if r.failure:
                raise SystemExit(f"{path}: {r.key} failed: {r.failure}")
        return (path.name, a.device_summary.median, b.device_summary.median,
                a.latency_summary.median, b.latency_summary.median)
    finally:
        worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+", type=Path)
    parser.add_argument("--max-time", type=float, default=10.0)
    args = parser.parse_args()
    rows = [bench(p.resolve(), args.max_time) for p in args.workdirs]
    print(f"{'workdir':<24} {'in-process':>11} {'worker':>11} {'ratio':>7} {'lat in-proc':>12} {'lat worker':>11}")
    for name, a, b, la, lb in rows:
        print(f"{name:<24} {a * 1e6:>9.1f}us {b * 1e6:>9.1f}us {b / a:>7.4f} {la * 1e6:>10.1f}us {lb * 1e6:>9.1f}us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
