#!/usr/bin/env python3
"""GPU validation of the timing engine: the three figures, do_bench agreement, twins, side streams, graph mode."""

# Run from the repo root on a CUDA machine (no install needed; logs go to $OUT, default ./out):
#   OUT=/tmp/out python3 benchmarks/check_timing.py
# Checks, each a row of the table printed last (device time gates; see README "Speed"):
#   bandwidth:     a bandwidth-bound kernel on 8 MiB (read 8 MiB, write 8 MiB): device time within
#                  KERNEL_SUM_TOLERANCE of the summed kernel time of its trace, and within
#                  FLOOR_FACTOR of the copy-bandwidth floor (16 MiB at COPY_BANDWIDTH);
#   launch-bound:  50 tiny kernels: latency at least LAUNCH_RATIO x device time, and the host
#                  stayed ahead of the GPU in almost every round;
#   trace escape:  a ~5 us kernel left on an unjoined side stream fails through the kernel
#                  trace; the same kernel joined back passes (neither check flags it);
#   default:       the repo's own workdir (model.py, GPT-2 attention) through `pytest -m perf`:
#                  device time, latency and kernel sum of every contender, and the gate;
#   twin:          one contender timed as two contenders: ratio of medians within
#                  TWIN_TOLERANCE of 1 (a long, a short and the 8 MiB kernel);
#   do_bench:      the engine's median within DO_BENCH_TOLERANCE of triton.testing.do_bench's;
#   side stream:   whole contenders on a side stream fail with "escaped the measured stream"
#                  (the latency runs' device-wide synchronise); the honest one does not;
#   cuda graph:    graph mode runs and agrees with the plain mode on a long kernel.
# Exit status 0 when every row passes, 1 otherwise, 2 without a CUDA device.

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_cudaopt.primitives import environment
from pytest_cudaopt.results import report  # noqa: E402
from pytest_cudaopt.perf import clocks, engine, decision as gate, stats, trace  # noqa: E402  (binds the timing functions first)
from pytest_cudaopt.perf.feed import Feed  # noqa: E402

import torch  # noqa: E402

OUT = Path(os.environ.get("OUT") or REPO / "out")
KERNEL_SUM_TOLERANCE = 0.15
COPY_BANDWIDTH = 4.3e12      # bytes/s, measured device-to-device copy on the H200
FLOOR_FACTOR = 2.0
LAUNCH_RATIO = 2.0
QUICK = engine.Config(warmup=0.3, max_time=5.0, target_rse=0.005)
DEFAULT_PROBLEM_TIMEOUT = 240

DO_BENCH_TOLERANCE = 0.05
TWIN_TOLERANCE = 0.02
GRAPH_TOLERANCE = 0.05
CONFIG = engine.Config(warmup=0.5, max_time=6.0, target_rse=0.005)
# (a) compares with do_bench, which times one function alone for `rep` ms back to back. The
# engine does the same here: one contender, a fixed second of runs (the stop rule cannot fire).
# Interleaved with lighter contenders, a power-hungry kernel (fp16 GEMM) runs at higher clocks
# than alone; the engine's default, interleaving, holds every contender to the same state.
# Even alone, each of the engine's rounds lets the device idle (the latency pass starts from an
# idle device), which a back-to-back fp16 GEMM at the 700 W cap never gets: measured on the
# H200, 1.46 ms against do_bench's 1.67 ms (SM clock 1.98 vs ~1.5 GHz). That row is reported,
# not judged; the tolerance judges the kernels that do not reach the power cap.
POWER_CAPPED = {"hgemm 8192 fp16"}
ALONE = engine.Config(warmup=0.5, max_time=1.0, target_rse=1e-12)
DUMMY_INPUTS = Feed(lambda n: [])  # contenders below close over their own tensors
ROWS: list[dict[str, str]] = []


def row(check: str, contender: str, engine: float | None, reference: float | None, ratio: float | None,
        limit: str, passed: bool, detail: str = "") -> None:
    ROWS.append({"check": check, "contender": contender, "engine median": stats.format_seconds(engine),
                 "reference": stats.format_seconds(reference),
                 "ratio": "-" if ratio is None else f"{ratio:.4f}", "limit": limit,
                 "result": "PASS" if passed else "FAIL", "detail": detail})


def contender(key: str, fn) -> engine.Contender:
    return engine.Contender(key, lambda: fn(), check=False)


def log_json(name: str, data) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(json.dumps(data, indent=2, default=str) + "\n")


def figures(r: engine.ContenderResult) -> str:
    return (f"device {stats.format_seconds(r.device_summary.median)}, latency "
            f"{stats.format_seconds(r.latency_summary.median)}")


def check_bandwidth(tracer: trace.ProfilerTracer) -> None:
    print("(bandwidth) 8 MiB in, 8 MiB out", flush=True)
    x = torch.randn(512, 4096, device="cuda")  # 8 MiB of float32
    m = engine([contender("mul 8 MiB", lambda: x * 2.0)], config=QUICK)
    r = m["mul 8 MiB"]
    t = trace.trace_lineup([contender("mul 8 MiB", lambda: x * 2.0)], [], tracer,
                           {"mul 8 MiB": r.latency_summary.median})["mul 8 MiB"]
    log_json("bandwidth_trace.json", t.to_json())
    device = r.device_summary.median
    floor = 2 * x.numel() * x.element_size() / COPY_BANDWIDTH
    ksum = None if t.error else t.kernel_sum
    ratio = device / ksum if ksum else None
    ok = r.failure is None and ratio is not None and abs(ratio - 1) <= KERNEL_SUM_TOLERANCE
    row("bandwidth", "mul 8 MiB: device / kernel sum", device, ksum, ratio,
        f"1 +- {KERNEL_SUM_TOLERANCE:g}", ok, r.failure or t.error or f"{figures(r)}; {t.summary()}")
    ok = r.failure is None and device <= FLOOR_FACTOR * floor
    row("bandwidth", "mul 8 MiB: device / floor", device, floor, device / floor, f"<= {FLOOR_FACTOR:g}", ok,
        f"floor: 16 MiB at {COPY_BANDWIDTH / 1e12:.1f} TB/s; achieved "
        f"{2 * x.numel() * x.element_size() / device / 1e12:.2f} TB/s")


def check_launch_bound() -> None:
    print("(launch-bound) 50 tiny kernels", flush=True)
    v = torch.randn(256, device="cuda")

    def tiny():
        out = v
        for _ in range(50):
            out = out + 1.0
        return out

    m = engine([contender("50 tiny kernels", tiny)], config=QUICK)
    r = m["50 tiny kernels"]
    device, latency = r.device_summary.median, r.latency_summary.median
    ratio = latency / device if r.samples else None
    ahead = m.queued_rounds - m.behind_rounds
    ok = r.failure is None and ratio is not None and ratio >= LAUNCH_RATIO and ahead >= 0.9 * m.queued_rounds
    row("launch-bound", "50 tiny kernels: latency / device", latency, device, ratio, f">= {LAUNCH_RATIO:g}", ok,
        r.failure or f"{figures(r)}; host ahead in {ahead} of {m.queued_rounds} rounds; "
                     f"notes: {'; '.join(gate.figure_warnings(device, latency, None)) or '-'}")


def check_trace_escape(tracer: trace.ProfilerTracer) -> None:
    print("(trace escape) a ~5 us kernel on a side stream, unjoined and joined", flush=True)
    x = torch.randn(512, 4096, device="cuda")
    side = torch.cuda.Stream()

    def unjoined():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return x * 2.0

    def joined():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = x * 2.0
        torch.cuda.current_stream().wait_stream(side)
        return out

    contenders = [contender("unjoined", unjoined), contender("joined", joined)]
    m = engine(contenders, config=QUICK)
    traces = trace.trace_lineup(contenders, [], tracer, {k: r.latency_summary.median for k, r in m.results.items()})
    log_json("trace_escape.json", {k: t.to_json() for k, t in traces.items()})
    for key, should_fail in (("unjoined", True), ("joined", False)):
        r, t = m[key], traces[key]
        found = trace.escape_failure(t)
        side_kernels = [k for k in t.kernels if k.stream != t.calling_stream]
        size = stats.format_seconds(sum(k.duration for k in side_kernels)) if side_kernels else "-"
        ok = (t.error is None and (found is not None) == should_fail
              and (should_fail or r.failure is None))
        row("trace escape", f"{key} side stream ({size})", r.summary.median, None, None,
            "caught" if should_fail else "passes", ok,
            t.error or (found or "no escape in the trace")
            + f"; latency check: {'flagged' if r.failure else 'not flagged'} "
              f"(escape median {stats.format_seconds(r.escape_median)})")


def check_default_problem() -> None:
    print("(default) pytest model_new.py -m perf on the repo's workdir", flush=True)
    path = OUT / "perf_default.json"
    cmd = [sys.executable, "-m", "pytest", "model_new.py", "-m", "perf", "-p", "no:cacheprovider", "-q",
           f"--cudaopt-report={path}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=DEFAULT_PROBLEM_TIMEOUT)
    (OUT / "perf_default.log").write_text(proc.stdout + proc.stderr)
    print(f"  pytest rc {proc.returncode} in {time.perf_counter() - start:.0f} s (log: {OUT / 'perf_default.log'})",
          flush=True)
    if not path.is_file():
        row("default", "-", None, None, None, "-", False, f"no report (rc {proc.returncode}); see perf_default.log")
        return
    (rec,) = [r for r in json.loads(path.read_text())["results"] if r["kind"] == "perf"]
    data = rec["data"]
    for c in data["timing"]["contenders"]:
        t = data["traces"].get(c["key"]) or {}
        device, latency, ksum = c["device_median_s"], c["latency_median_s"], t.get("kernel_sum_s")
        ratio = device / ksum if device and ksum else None
        ok = c["failure"] is None and ratio is not None and abs(ratio - 1) <= KERNEL_SUM_TOLERANCE
        if c["key"] == "custom":
            ok = ok and rec["passed"]
        row("default", c["label"], device, ksum, ratio, f"1 +- {KERNEL_SUM_TOLERANCE:g}", ok,
            f"latency {stats.format_seconds(latency)}; "
            + (f"{t.get('kernels_n')} kernels on {len(t.get('streams') or [])} stream(s)" if ksum else
               t.get("error", "no trace"))
            + (f"; gate {'PASS' if rec['passed'] else 'FAIL'}" if c["key"] == "custom" else ""))


def engine(contenders: list[engine.Contender], clock: clocks.CudaClock | None = None,
           config: engine.Config = CONFIG) -> engine.Measurement:
    m = engine.measure(contenders, DUMMY_INPUTS, clock=clock or clocks.CudaClock(), config=config)
    print(f"  engine: {m.rounds} rounds in {m.seconds:.1f} s, stopped by {m.stop_reason}, gate clock {m.gate_clock}, "
          f"host ahead in {m.queued_rounds - m.behind_rounds} of {m.queued_rounds} queued rounds, "
          f"escape floor {stats.format_seconds(m.escape_floor)}, flush {m.flush_bytes / 2**20:.0f} MiB", flush=True)
    for r in m.results.values():
        s = r.summary
        print(f"    {r.key:<22} median {stats.format_seconds(s.median):>9}  IQR {stats.format_seconds(s.iqr):>9}  "
              f"n {s.n:>5}  rse {s.rse:.4f}  device {stats.format_seconds(r.device_summary.median):>9}  "
              f"latency {stats.format_seconds(r.latency_summary.median):>9}  "
              f"escape {stats.format_seconds(r.escape_median):>9}  "
              f"failure {r.failure}", flush=True)
    return m


def workloads() -> dict[str, object]:
    a = torch.randn(4096, 4096, device="cuda")
    h = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    big = torch.randn(256 * 2**20, device="cuda")     # 1 GiB read + 1 GiB written
    small = torch.randn(16 * 2**20, device="cuda")    # 64 MiB read + 64 MiB written
    tiny = torch.randn(2 * 2**20, device="cuda")      # 8 MiB read + 8 MiB written
    return {
        "sgemm 4096 fp32": lambda: a @ a,
        "hgemm 8192 fp16": lambda: h @ h,
        "add 256Mi fp32": lambda: big + 1.0,
        "add 16Mi fp32": lambda: small + 1.0,
        "mul 8 MiB": lambda: tiny * 2.0,
    }


def check_do_bench(work: dict) -> dict[str, float]:
    print("(do_bench) engine vs triton.testing.do_bench", flush=True)
    try:
        from triton.testing import do_bench
    except ImportError as exc:
        row("do_bench", "-", None, None, None, "-", False, f"triton not importable: {exc}")
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
        ok = r.failure is None and ratio is not None and (abs(ratio - 1) <= DO_BENCH_TOLERANCE or n in POWER_CAPPED)
        limit = "power cap: info" if n in POWER_CAPPED else f"1 +- {DO_BENCH_TOLERANCE:g}"
        row("do_bench", n, mid, reference, ratio, limit, ok,
            r.failure or f"do_bench {stats.format_seconds(before[n])} before, {stats.format_seconds(after[n])} after; "
                         f"n {r.summary.n}, IQR {stats.format_seconds(r.summary.iqr)}; "
                         f"interleaved with the others: {stats.format_seconds(together[n].summary.median)}")
    return medians


def check_twins(work: dict) -> None:
    print("(twin) one contender timed as two", flush=True)
    for n in ("sgemm 4096 fp32", "add 16Mi fp32", "mul 8 MiB"):
        fn = work[n]
        m = engine([contender("A", fn), contender("A again", fn)])
        a, b = m["A"], m["A again"]
        ratio = a.summary.median / b.summary.median if a.samples and b.samples else None
        ok = a.failure is None and b.failure is None and ratio is not None and abs(ratio - 1) <= TWIN_TOLERANCE
        row("twin", n, a.summary.median, b.summary.median, ratio, f"1 +- {TWIN_TOLERANCE:g}", ok,
            a.failure or b.failure or f"n {a.summary.n}/{b.summary.n}, rse {a.summary.rse:.4f}/{b.summary.rse:.4f}")


def check_side_stream() -> None:
    print("(side stream) work on a side stream, caught by the latency runs", flush=True)
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
        limit = engine.escape_limit(r.latency_summary.median, m.escape_floor, CONFIG) if r.samples else None
        row("side stream", key, r.summary.median, None, None,
            f"escape <= {stats.format_seconds(limit)}", ok,
            f"escape median {stats.format_seconds(r.escape_median)}; "
            + ("caught" if caught else f"failure: {r.failure}" if r.failure else "not flagged"))


def check_graph_mode(work: dict, plain: dict[str, float]) -> None:
    print("(cuda graph) CUDA-graph mode", flush=True)
    n = "sgemm 4096 fp32"
    m = engine([contender(n, work[n]), contender("add 16Mi fp32", work["add 16Mi fp32"])],
               clock=clocks.CudaClock(graphs=True))
    r = m[n]
    reference = plain.get(n)
    ratio = r.summary.median / reference if r.samples and reference else None
    ok = r.failure is None and ratio is not None and abs(ratio - 1) <= GRAPH_TOLERANCE
    row("cuda graph", n, r.summary.median, reference, ratio, f"1 +- {GRAPH_TOLERANCE:g}", ok,
        r.failure or "reference: the plain mode's median in (a)")
    short = m["add 16Mi fp32"]
    row("cuda graph", "add 16Mi fp32", short.summary.median, None, None, "runs", short.failure is None,
        short.failure or "graph replay (no reference)")


def main() -> int:
    if not torch.cuda.is_available():
        print("check_timing: no CUDA device visible; run this on the GPU machine", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    env = environment.environment()
    print(f"check_timing: {env['gpu']} ({env['gpu_capability']}), torch {env['torch']}, CUDA {env['cuda']}, "
          f"L2 {torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MiB, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    start = time.perf_counter()
    work = workloads()
    plain: dict[str, float] = {}
    tracer = trace.ProfilerTracer("cuda")
    steps = [("bandwidth", lambda: check_bandwidth(tracer)),
             ("launch-bound", check_launch_bound),
             ("trace escape", lambda: check_trace_escape(tracer)),
             ("twin", lambda: check_twins(work)),
             ("do_bench", lambda: plain.update(check_do_bench(work))),
             ("side stream", check_side_stream),
             ("cuda graph", lambda: check_graph_mode(work, plain)),
             ("default", check_default_problem)]
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # a broken check is a failed row, the others still run
            row(name, "-", None, None, None, "-", False, f"raised {type(exc).__name__}: {exc}")
    failed = [r for r in ROWS if r["result"] != "PASS"]
    log_json("check_timing.json", {"environment": env, "rows": ROWS})
    print()
    print(report.render_rows(ROWS, title=f"check_timing: {env['gpu']}, torch {env['torch']}, "
                                           f"{time.perf_counter() - start:.0f} s",
                             notes=[f"{len(ROWS) - len(failed)} of {len(ROWS)} checks passed"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
