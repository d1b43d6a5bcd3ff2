"""What the copy out of a gated batch costs beyond its own GPU time, by what the batch wrote: the timed window's empty batches (window.JudgeWindow.probe) whose worker writes outputs of a given size and count behind the gate, after spinning a given time.

    python benchmarks/gate_excess.py [--reps 12] [--sizes 4K,16M,48M,144M,256M] [--counts 1,3,16] [--spins-us 0,2500]

A worker with no workdir (nothing but the harness's own code runs in it) and its calibrated gate;
then for each (size, count, spin) `--reps` probes, printing the medians of the window from
opening to DONE and of the copy's excess (the host time from DONE to the copy's end less the
copy's GPU time), the excess beyond the calibrated 4 KB one, and what the gate allows for it
(`JudgeWindow.extra` of the window). Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_cudaopt.remote.worker import Worker  # noqa: E402

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text: str) -> int:
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--sizes", default="4K,16M,48M,144M,256M")
    parser.add_argument("--counts", default="1,3,16")
    parser.add_argument("--spins-us", default="0,2500")
    args = parser.parse_args()
    from pytest_cudaopt.perf.clocks import GpuLead

    lead = GpuLead("cuda")
    lead.calibrate()
    rate = lead.cycles_per_second
    with tempfile.TemporaryDirectory() as empty:
        worker = Worker(Path(empty), None, "cuda").start(require_workdir=False)
        try:
            gate = worker.stream_gate
            if gate is None:
                raise SystemExit(f"no timed window: {worker.stream_gate_error}")
            base = statistics.median(b for _, b in gate.parts)
            print(f"calibrated: fixed {gate.fixed * 1e6:.1f} us, 4 KB copy excess median {base * 1e6:.1f} us; after "
                  "spins (open->DONE: extra) " + ", ".join(f"{a * 1e6:.0f}: {gate.extra(a) * 1e6:.1f}"
                                                          for a, _ in gate.spun) + " us", flush=True)
            print(f"{'bytes':>8} {'count':>5} {'spin us':>8} {'open->DONE':>11} {'excess':>8} {'beyond 4K':>10} {'extra':>8}")
            for spin in [float(x) for x in args.spins_us.split(",")]:
                for count in [int(x) for x in args.counts.split(",")]:
                    for text in args.sizes.split(","):
                        each = size(text) // count
                        rows = [gate.probe(worker, each, count, int(spin * 1e-6 * rate)) for _ in range(args.reps)]
                        window = statistics.median(a for a, _ in rows)
                        excess = statistics.median(b for _, b in rows)
                        print(f"{text:>8} {count:>5} {spin:>8.0f} {window * 1e6:>9.1f}us {excess * 1e6:>6.1f}us "
                              f"{(excess - base) * 1e6:>8.1f}us {gate.extra(window) * 1e6:>6.1f}us", flush=True)
        finally:
            worker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
