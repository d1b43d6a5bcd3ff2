"""The worker's cost on the timed figure: a workdir's ModelNew timed in-process and through its worker, side by side in one engine run (CUDA events, L2 flushed, fresh inputs per call).

    python benchmarks/bench_worker.py WORKDIR [WORKDIR ...] [--max-time 10] [--sandbox off,require] [--gpu-batch 1,16]

Prints, per workdir, the two device-time medians and their ratio (worker / in-process), and the
latency medians (the latency includes the worker's round trip by design). With `--sandbox` one
worker per cudaopt_sandbox mode named, all timed in the same engine run: the OS sandbox's cost
side by side (each worker's row against the in-process one). With `--gpu-batch` one run per
batch length named (CudaClock.max_batch, which the harness keeps at 1): for each, the round trip
less the worker's figures per batch (the honest margin the allowance must cover) beside the
allowance itself, medians and the largest. The in-process model
is loaded only here, for the comparison: the harness itself never loads it in the judging process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_cudaopt import extension as build  # noqa: E402
from pytest_cudaopt.perf import clocks, engine  # noqa: E402
from pytest_cudaopt.perf.feed import Feed  # noqa: E402
from pytest_cudaopt.workdir import load_reference, load_workdir  # noqa: E402
from pytest_cudaopt.remote.worker import Worker  # noqa: E402


def describe_timing(worker: Worker, through) -> None:
    """The timed window's calibration, then per batch size: the worker's own figure a call, the
    window less the figures, the allowance, and (gated batches) the window's two parts."""
    mid = lambda xs: sorted(xs)[len(xs) // 2] * 1e6 if xs else float("nan")  # noqa: E731
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))] * 1e6 if xs else float("nan")  # noqa: E731
    gate = worker.stream_gate
    if gate is None:
        print(f"  no timed window: {worker.stream_gate_error}", flush=True)
    else:
        print(f"  timed window: fixed part {gate.fixed * 1e6:.1f} us; calibration windows "
              f"{', '.join('%.0f' % (w * 1e6) for w in sorted(gate.windows))} us; open->DONE median "
              f"{mid([a for a, _ in gate.parts]):.1f}, copy excess median {mid([b for _, b in gate.parts]):.1f} us; "
              f"spun (open->DONE, excess): {', '.join('%.0f/%.0f' % (a * 1e6, b * 1e6) for a, b in gate.spun)} us; "
              f"{through.gated} of {len(through.clock.batches)} timed batches behind it"
              f"{'; ' + through.gate_off if through.gate_off else ''}", flush=True)
    for calls in sorted({b.calls for b in through.clock.batches}):
        rows = [(b.shift, b.allowance, sum(b.figures)) for b in through.clock.batches if b.calls == calls]
        windows = [(a, b) for c, a, b in through.windows if c == calls]
        margins = [m for m, _, _ in rows]
        print(f"  batches of {calls}: {len(rows)}; the worker's own figure {mid([r for *_, r in rows]) / calls:.1f} us "
              f"a call; window - honest part - figures median {q(margins, 0.5):.1f} us [p10 {q(margins, 0.1):.1f}, p90 "
              f"{q(margins, 0.9):.1f}, largest {q(margins, 1):.1f}]; allowance median {mid([a for _, a, _ in rows]):.1f} us"
              + (f"; gated: open->DONE median {mid([a for a, _ in windows]):.1f} us, copy excess median "
                 f"{mid([b for _, b in windows]):.1f} us" if windows else ""), flush=True)


HARNESS_BATCH = clocks.CudaClock.max_batch


def by_position(worker_calls: list[tuple[int, list[float]]], local: list[float], batch: int) -> None:
    """The median figure of each call's place in a batch of `batch`: the worker's (own figures of
    its batches of that length) and the in-process contender's (its queued figures, in order)."""
    mid = lambda xs: sorted(xs)[len(xs) // 2] * 1e6 if xs else float("nan")  # noqa: E731
    rows = [figures for calls, figures in worker_calls if calls == batch]
    if batch < 2 or not rows:
        return
    places = range(batch)
    print("  by place in a batch (worker | in-process): " + "; ".join(
        f"{i}: {mid([r[i] for r in rows]):.1f} | {mid(local[i::batch]):.1f}" for i in places), flush=True)


def bench(path: Path, max_time: float, modes: list[str], batch: int) -> list[tuple[str, float, float, float, float]]:
    device = "cuda"
    # 0: as the harness sizes batches; -1: as the engine does without the clock's cap
    clocks.CudaClock.max_batch = None if batch < 0 else batch or HARNESS_BATCH
    result = build.build(path)
    local = load_workdir(path, result.module)
    workers = {mode: Worker(path, result.so_path, device, sandbox=mode).start() for mode in modes}
    worker = workers[modes[0]]
    try:
        remote = load_reference(path, worker)
        model, inproc = local.make_models(device, seed=1)
        throughs = {mode: load_reference(path, w).make_models(device, seed=1)[1] for mode, w in workers.items()}

        def draw(n: int) -> list:
            with worker.sharing():
                return remote.inputs(1000 + n, device, isolated=False)

        names = {mode: "worker" if len(modes) == 1 else f"worker (sandbox {mode})" for mode in modes}
        contenders = [engine.Contender("in-process", inproc),
                      *[engine.Contender(names[mode], throughs[mode], every_call=True) for mode in modes]]
        sized = dict(max_batch=batch, batch_window=0.02 if batch > 1 else engine.Config.batch_window) if batch > 0 else {}
        config = engine.Config(max_time=max_time, warmup=0.5, target_rse=0.002, min_runs=200, **sized)
        def compare(output, expected):
            return None if torch.allclose(output, expected, atol=1e-4, rtol=1e-4) else "mismatch"

        with torch.no_grad():
            found = engine.measure(contenders, Feed(draw, lambda *a: model(*a)), clock=clocks.CudaClock(device),
                                   config=config, compare=compare)
        a = found["in-process"]
        for mode in workers:
            through = throughs[mode]
            print(f"{path.name} [{mode}]: batch {found.batch}; {through.timing_note() or 'no figure raised'}",
                  flush=True)
            describe_timing(workers[mode], through)
            by_position([(b.calls, b.figures) for b in through.clock.batches], list(a.device), found.batch)
        rows = []
        for mode in modes:
            b = found[names[mode]]
            for r in (a, b):
                if r.failure:
                    raise SystemExit(f"{path}: {r.key} failed: {r.failure}")
            label = (path.name if len(modes) == 1 else f"{path.name} [{mode}]") + (
                f" B{batch}" if batch > 1 else f" auto B{found.batch}" if batch < 1 else "")
            rows.append((label, a.device_summary.median, b.device_summary.median,
                         a.latency_summary.median, b.latency_summary.median))
        return rows
    finally:
        for w in workers.values():
            w.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="+", type=Path)
    parser.add_argument("--max-time", type=float, default=10.0)
    parser.add_argument("--sandbox", default="auto", help="cudaopt_sandbox modes, comma separated (default: auto)")
    parser.add_argument("--gpu-batch", default="1",
                        help="calls per timed batch, comma separated; 0: as the harness sizes them, -1: as the "
                             "engine would without the clock's cap (default: 1)")
    args = parser.parse_args()
    modes = [m for m in args.sandbox.split(",") if m]
    rows = [row for p in args.workdirs for b in map(int, args.gpu_batch.split(","))
            for row in bench(p.resolve(), args.max_time, modes, b)]
    print(f"{'workdir':<32} {'in-process':>11} {'worker':>11} {'ratio':>7} {'lat in-proc':>12} {'lat worker':>11}")
    for name, a, b, la, lb in rows:
        print(f"{name:<32} {a * 1e6:>9.1f}us {b * 1e6:>9.1f}us {b / a:>7.4f} {la * 1e6:>10.1f}us {lb * 1e6:>9.1f}us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
