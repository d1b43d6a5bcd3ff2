#!/usr/bin/env python3
"""GPU validation of the timing engine: agreement with triton's do_bench, a twin ratio, side streams caught, graph mode."""

# Run from the repo root on a CUDA machine: python3 benchmarks/check_timing.py
# (no install needed). Checks, each a row of the table printed last:
#   (a) do_bench:    the engine's median of each contender within DO_BENCH_TOLERANCE of
#                    triton.testing.do_bench's median (mean of one run before, one after);
#   (b) twin:        one contender timed as two contenders: ratio of medians within
#                    TWIN_TOLERANCE of 1 (a long and a short kernel);
#   (c) side stream: a contender whose work runs on another stream (all of it, or its tail)
#                    fails with "escaped the measured stream"; the honest one does not;
#   (d) cuda graph:  graph mode runs and agrees with the plain mode on a long kernel.
# Exit status 0 when every row passes, 1 otherwise, 2 without a CUDA device.

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_cudaopt import report, timing  # noqa: E402  (binds the timing functions first)

import torch  # noqa: E402

DO_BENCH_TOLERANCE = 0.05
TWIN_TOLERANCE = 0.02
GRAPH_TOLERANCE = 0.05
CONFIG = timing.Config(warmup=0.5, max_time=10.0, target_rse=0.005)
# (a) compares with do_bench, which times one function alone for `rep` ms back to back. The
# engine does the same here: one contender, a fixed second of runs (the stop rule cannot fire).
# Interleaved with lighter contenders, a power-hungry kernel (fp16 GEMM) runs at higher clocks
# than alone; the engine's default, interleaving, holds every contender to the same state.
ALONE = timing.Config(warmup=0.5, max_time=1.0, target_rse=1e-12)
DUMMY_INPUTS = [[]]  # contenders below close over their own tensors
ROWS: list[dict[str, str]] = []


def row(check: str, contender: str, engine: float | None, reference: float | None, ratio: float | None,
        limit: str, passed: bool, detail: str = "") -> None:
    ROWS.append({"check": check, "contender": contender, "engine median": timing.format_seconds(engine),
                 "reference": timing.format_seconds(reference),
                 "ratio": "-" if ratio is None else f"{ratio:.4f}", "limit": limit,
                 "result": "PASS" if passed else "FAIL", "detail": detail})


def contender(key: str, fn) -> timing.Contender:
    return timing.Contender(key, lambda: fn(), check=False)


def engine(contenders: list[timing.Contender], clock: timing.CudaClock | None = None,
           config: timing.Config = CONFIG) -> timing.Measurement:
    m = timing.measure(contenders, DUMMY_INPUTS, clock=clock or timing.CudaClock(), config=config)
    print(f"  engine: {m.rounds} rounds in {m.seconds:.1f} s, stopped by {m.stop_reason}, "
          f"escape floor {timing.format_seconds(m.escape_floor)}, flush {m.flush_bytes / 2**20:.0f} MiB", flush=True)
    for r in m.results.values():
        s = r.summary
        print(f"    {r.key:<22} median {timing.format_seconds(s.median):>9}  IQR {timing.format_seconds(s.iqr):>9}  "
              f"n {s.n:>5}  rse {s.rse:.4f}  escape {timing.format_seconds(r.escape_median):>9}  "
              f"failure {r.failure}", flush=True)
    return m


def workloads() -> dict[str, object]:
    a = torch.randn(4096, 4096, device="cuda")
    h = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    big = torch.randn(256 * 2**20, device="cuda")     # 1 GiB read + 1 GiB written
    small = torch.randn(16 * 2**20, device="cuda")    # 64 MiB read + 64 MiB written
    return {
        "sgemm 4096 fp32": lambda: a @ a,
        "hgemm 8192 fp16": lambda: h @ h,
        "add 256Mi fp32": lambda: big + 1.0,
        "add 16Mi fp32": lambda: small + 1.0,
    }


def check_do_bench(work: dict) -> dict[str, float]:
    print("(a) engine vs triton.testing.do_bench", flush=True)
    try:
        from triton.testing import do_bench
    except ImportError as exc:
        row("a do_bench", "-", None, None, None, "-", False, f"triton not importable: {exc}")
        return {}
    names = ["sgemm 4096 fp32", "hgemm 8192 fp16", "add 256Mi fp32"]
    before = {n: do_bench(work[n], warmup=100, rep=1000, return_mode="median") * 1e-3 for n in names}
    alone = {n: engine([contender(n, work[n])], config=ALONE)[n] for n in names}
    together = engine([contender(n, work[n]) for n in names])
    after = {n: do_bench(work[n], warmup=100, rep=1000, return_mode="median") * 1e-3 for n in names}
    medians = {}
    for n in names:
        r = alone[n]
        reference = (before[n] + after[n]) / 2
        mid = r.summary.median
        medians[n] = mid
        ratio = mid / reference if r.samples else None
        ok = r.failure is None and ratio is not None and abs(ratio - 1) <= DO_BENCH_TOLERANCE
        row("a do_bench", n, mid, reference, ratio, f"1 +- {DO_BENCH_TOLERANCE:g}", ok,
            r.failure or f"do_bench {timing.format_seconds(before[n])} before, {timing.format_seconds(after[n])} after; "
                         f"n {r.summary.n}, IQR {timing.format_seconds(r.summary.iqr)}; "
                         f"interleaved with the others: {timing.format_seconds(together[n].summary.median)}")
    return medians


def check_twins(work: dict) -> None:
    print("(b) one contender timed as two", flush=True)
    for n in ("sgemm 4096 fp32", "add 16Mi fp32"):
        fn = work[n]
        m = engine([contender("A", fn), contender("A again", fn)])
        a, b = m["A"], m["A again"]
        ratio = a.summary.median / b.summary.median if a.samples and b.samples else None
        ok = a.failure is None and b.failure is None and ratio is not None and abs(ratio - 1) <= TWIN_TOLERANCE
        row("b twin", n, a.summary.median, b.summary.median, ratio, f"1 +- {TWIN_TOLERANCE:g}", ok,
            a.failure or b.failure or f"n {a.summary.n}/{b.summary.n}, rse {a.summary.rse:.4f}/{b.summary.rse:.4f}")


def check_side_stream() -> None:
    print("(c) work on a side stream", flush=True)
    x = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def honest():
        return (x @ x) @ x

    def hidden():  # everything on a side stream, never joined back
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return (x @ x) @ x

    def tail():  # the first half measured, the second half on a side stream after it
        y = x @ x
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return y @ x

    m = engine([contender("honest", honest), contender("hidden", hidden), contender("tail", tail)])
    for key, should_fail in (("honest", False), ("hidden", True), ("tail", True)):
        r = m[key]
        caught = r.failure is not None and "escaped the measured stream" in r.failure
        ok = caught if should_fail else r.failure is None
        limit = timing.escape_limit(r.summary.median, m.escape_floor, CONFIG) if r.samples else None
        row("c side stream", key, r.summary.median, None, None,
            f"escape <= {timing.format_seconds(limit)}", ok,
            f"escape median {timing.format_seconds(r.escape_median)}; "
            + ("caught" if caught else f"failure: {r.failure}" if r.failure else "not flagged"))


def check_graph_mode(work: dict, plain: dict[str, float]) -> None:
    print("(d) CUDA-graph mode", flush=True)
    n = "sgemm 4096 fp32"
    m = engine([contender(n, work[n]), contender("add 16Mi fp32", work["add 16Mi fp32"])],
               clock=timing.CudaClock(graphs=True))
    r = m[n]
    reference = plain.get(n)
    ratio = r.summary.median / reference if r.samples and reference else None
    ok = r.failure is None and ratio is not None and abs(ratio - 1) <= GRAPH_TOLERANCE
    row("d cuda graph", n, r.summary.median, reference, ratio, f"1 +- {GRAPH_TOLERANCE:g}", ok,
        r.failure or "reference: the plain mode's median in (a)")
    short = m["add 16Mi fp32"]
    row("d cuda graph", "add 16Mi fp32", short.summary.median, None, None, "runs", short.failure is None,
        short.failure or "graph replay (no reference)")


def main() -> int:
    if not torch.cuda.is_available():
        print("check_timing: no CUDA device visible; run this on the GPU machine", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    env = report.environment()
    print(f"check_timing: {env['gpu']} ({env['gpu_capability']}), torch {env['torch']}, CUDA {env['cuda']}, "
          f"L2 {torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MiB, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    start = time.perf_counter()
    work = workloads()
    plain: dict[str, float] = {}
    steps = [("a do_bench", lambda: plain.update(check_do_bench(work))),
             ("b twin", lambda: check_twins(work)),
             ("c side stream", check_side_stream),
             ("d cuda graph", lambda: check_graph_mode(work, plain))]
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # a broken check is a failed row, the others still run
            row(name, "-", None, None, None, "-", False, f"raised {type(exc).__name__}: {exc}")
    failed = [r for r in ROWS if r["result"] != "PASS"]
    print()
    print(report.render_rows(ROWS, title=f"check_timing: {env['gpu']}, torch {env['torch']}, "
                                           f"{time.perf_counter() - start:.0f} s",
                             notes=[f"{len(ROWS) - len(failed)} of {len(ROWS)} checks passed"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
