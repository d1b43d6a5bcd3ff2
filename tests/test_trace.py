"""The kernel trace: Chrome-trace parsing, the stream-escape rule, tracing a lineup; a CPU profiler smoke test."""

import subprocess
import sys

import pytest
import torch

from pytest_cudaopt.perf import trace
from pytest_cudaopt.perf.engine import Contender
from pytest_cudaopt.perf.trace import BEGIN, CALL, END, LEAD, Kernel, Trace
from doubles import FakeTracer
from support import subprocess_env

CALLING, SIDE = 7, 13


class Chrome:
    """Chrome-trace events as torch.profiler exports them: host ranges (user_annotation),
    launches (cuda_runtime / cuda_driver with a correlation id) and device activity (kernel,
    gpu_memcpy with stream, grid, correlation). Times in microseconds."""

    def __init__(self):
        self.events = []
        self.corr = 0

    def range(self, name, ts, dur):
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": 1})

    def launch(self, ts, name, start, dur, stream, cat="kernel", api="cuda_runtime", grid=(80, 1, 1)):
        self.corr += 1
        self.events.append({"ph": "X", "cat": api, "name": "cudaLaunchKernel", "ts": ts, "dur": 2.0,
                            "args": {"correlation": self.corr}})
        args = {"stream": stream, "correlation": self.corr, "device": 0}
        if cat == "kernel":
            args.update(grid=list(grid), block=[256, 1, 1])
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": start, "dur": dur, "args": args})

    @classmethod
    def call(cls, work, end_start=None):
        """The tracer's frame around `work(chrome)`: host launches between t=100 and 200 us;
        on the GPU the lead spin until 1000 us, the flush, BEGIN ending at 1100, END at
        `end_start` (default: right after the calling stream's work)."""
        c = cls()
        c.range(LEAD, 10, 20)
        c.launch(12, "void at::native::sleep(long)", 0, 1000, CALLING)
        c.launch(20, "void at::native::vectorized_elementwise_kernel<4, FillFunctor>", 1000, 90, CALLING)
        c.range(BEGIN, 40, 10)
        c.launch(42, "void at::native::vectorized_elementwise_kernel<4, FillFunctor>", 1095, 5, CALLING)
        c.range(CALL, 100, 100)
        last = work(c)
        c.range(END, 210, 10)
        c.launch(212, "void at::native::vectorized_elementwise_kernel<4, FillFunctor>",
                 end_start if end_start is not None else last, 2, CALLING)
        return c.events


def honest(c):
    c.launch(110, "void gemm_kernel<128>(float const*)", 1100, 300, CALLING, grid=(132, 1, 1))
    c.launch(120, "triton_poi_fused_add_0", 1400, 50, CALLING, api="cuda_driver")
    c.launch(130, "Memcpy DtoD (Device -> Device)", 1450, 10, CALLING, cat="gpu_memcpy")
    return 1460


def test_the_calls_kernels_are_parsed_with_stream_grid_and_duration_and_the_tracers_own_left_out():
    t = trace.parse_chrome(Chrome.call(honest))
    assert t.error is None
    assert t.calling_stream == CALLING
    assert t.window == pytest.approx((1100e-6, 1460e-6))
    assert [(k.kind, k.short_name, k.stream) for k in t.kernels] == [
        ("kernel", "gemm_kernel", CALLING), ("kernel", "triton_poi_fused_add_0", CALLING),
        ("memcpy", "Memcpy DtoD (Device -> Device)", CALLING)]
    assert t.kernels[0].grid == (132, 1, 1) and t.kernels[0].block == (256, 1, 1)
    assert t.kernels[0].duration == pytest.approx(300e-6)
    assert t.kernel_sum == pytest.approx(360e-6)
    assert t.count == 2
    assert t.summary() == "2 kernels (1 Triton), 1 memcpy on 1 stream"
    assert t.escapes() == []


def test_side_stream_work_joined_back_passes():
    def joined(c):
        # Forked after BEGIN; the calling stream waits for it, so END starts after it ends.
        c.launch(110, "side_kernel", 1100, 5, SIDE)
        c.launch(115, "main_kernel", 1100, 3, CALLING)
        return 1105

    t = trace.parse_chrome(Chrome.call(joined))
    assert t.streams == [CALLING, SIDE]
    assert t.escapes() == []
    assert trace.escape_failure(t) is None


def test_a_5_us_kernel_left_on_a_side_stream_fails_with_its_name_and_stream():
    def unjoined(c):
        c.launch(110, "void side_kernel<float>(float*)", 1100, 5, SIDE, grid=(1, 1, 1))
        return 1100  # nothing else on the calling stream: END runs at once

    t = trace.parse_chrome(Chrome.call(unjoined))
    (escape,) = t.escapes()
    assert escape.kernel.short_name == "side_kernel" and escape.kernel.stream == SIDE
    message = trace.escape_failure(t)
    assert message.startswith("work escaped the calling stream (kernel trace): kernel side_kernel, grid 1x1x1 "
                              f"on stream {SIDE} (calling stream {CALLING}, 5.00 us) ended 5.00 us after")
    assert "not joined back before the call returned" in message
    assert "torch.cuda.current_stream()" in message


def test_side_stream_work_that_does_not_wait_for_the_calling_stream_fails():
    def early(c):
        c.launch(110, "side_kernel", 400, 5, SIDE)  # runs during the lead spin: not ordered after the inputs
        c.launch(115, "main_kernel", 1100, 50, CALLING)
        return 1150

    (escape,) = trace.parse_chrome(Chrome.call(early)).escapes()
    assert escape.reason.startswith("started 700 us before the calling stream reached the call")


def test_a_copy_on_a_side_stream_counts_as_escaped_work_too():
    def copy(c):
        c.launch(110, "Memcpy DtoH (Device -> Pinned)", 1100, 20, SIDE, cat="gpu_memcpy")
        return 1101

    (escape,) = trace.parse_chrome(Chrome.call(copy)).escapes()
    assert escape.kernel.kind == "memcpy"


def test_a_trace_without_the_markers_says_so_and_finds_no_escape():
    events = [e for e in Chrome.call(honest) if e.get("name") != END]
    t = trace.parse_chrome(events)
    assert "no kernel for the tracer's cudaopt::end marker" in t.error
    assert t.escapes() == []
    assert t.to_json() == {"error": t.error}


def test_top_groups_kernels_by_name_largest_first():
    t = Trace([Kernel("a", 1, 0, 1.0), Kernel("b", 1, 1, 3.0), Kernel("a", 1, 4, 2.5)], calling_stream=1,
              window=(0, 10))
    assert [(name, calls, total) for name, calls, total, _ in t.top()] == [("a", 2, 3.5), ("b", 1, 3.0)]


def test_short_names_drop_templates_parameters_and_void():
    assert trace.short_name("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
                            "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)") == \
        "at::native::vectorized_elementwise_kernel"
    assert trace.short_name("triton_poi_fused_0") == "triton_poi_fused_0"
    # nvcc names kernels of an anonymous namespace with a leading "(anonymous namespace)::"
    assert trace.short_name("(anonymous namespace)::scale_kernel(float const*, float*, int)") == "scale_kernel"
    assert len(trace.short_name("k" * 100)) == 60


def test_trace_lineup_traces_each_contender_once_and_keeps_a_tracers_error():
    class Broken:
        def trace(self, contender, args, *, lead):
            raise RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")

    calls = []
    contenders = [Contender("a", lambda x: calls.append(x) or x), Contender("b", lambda x: x)]
    x = torch.ones(3)
    scripted = Trace([Kernel("k", 7, 0.0, 1e-6)], calling_stream=7, window=(0.0, 1.0))
    fake = FakeTracer({"a": scripted})
    found = trace.trace_lineup(contenders, [x], fake)
    assert fake.calls == ["a", "b"] and list(found) == ["a"] and found["a"] is scripted
    assert calls[0] is not x and torch.equal(calls[0], x)  # a clone
    found = trace.trace_lineup(contenders, [x], Broken())
    assert found["a"].error == "not traced: RuntimeError: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"


def test_no_tracer_without_a_cuda_device_or_when_turned_off():
    assert trace.default_tracer("cpu") is None
    assert trace.default_tracer("cuda", enabled=False) is None


def test_a_cpu_profile_exports_and_parses_the_tracers_ranges():
    # The tracer's profiler on the CPU: the same export and parser, no device activity to find.
    x = torch.randn(64)
    with trace.profiling(torch.device("cpu")) as prof:
        for name in (LEAD, BEGIN, CALL, END):
            with torch.profiler.record_function(name):
                x = x * 2
    events = trace.export_events(prof)
    assert {e["name"] for e in events if e.get("cat") == "user_annotation"} >= {LEAD, BEGIN, CALL, END}
    t = trace.parse_chrome(events)
    assert t.kernels == [] and "no kernel for the tracer's cudaopt::begin and cudaopt::end marker" in t.error


def test_profiling_imports_neither_inductor_nor_dynamo():
    # torch.profiler.profile would: seconds of the worker's first trace where no bytecode is cached.
    script = ("import sys, torch\nfrom pytest_cudaopt.perf import trace\n"
              "with trace.profiling(torch.device('cpu')):\n    torch.ones(3) + 1\n"
              "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'sympy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_the_profiler_tracer_passes_a_joined_side_stream_and_fails_an_unjoined_one():
    x = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()

    def joined(v):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = v * 2
        torch.cuda.current_stream().wait_stream(side)
        return out

    def unjoined(v):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return v * 2

    tracer = trace.ProfilerTracer("cuda")
    good = tracer.trace(Contender("joined", joined), [x])
    bad = tracer.trace(Contender("unjoined", unjoined), [x])
    assert good.error is None and good.count == 1 and good.escapes() == []
    (escape,) = bad.escapes()
    assert bad.error is None and escape.kernel.stream != bad.calling_stream


def test_a_contender_whose_timed_output_differed_is_traced_and_an_escape_named_first():
    """Work left on a side stream makes a worker's gated outputs differ (they are read when its
    calling stream's work ends): the trace's escape is the reason given first, before figures that
    could not be believed (on an H200 the side-stream attack was timed only by the round trip)."""
    from types import SimpleNamespace

    from pytest_cudaopt.perf.lineup import Lineup
    from pytest_cudaopt.perf.measurement import ContenderResult
    from pytest_cudaopt.perf.verdict import _traces

    def unjoined(c):
        c.launch(110, "side_kernel", 1100, 5, SIDE)
        return 1100

    results = {"custom": ContenderResult("custom", "ModelNew"), "eager": ContenderResult("eager", "Model"),
               "broken": ContenderResult("broken", "peer")}
    results["custom"].fail("output of timed round 1 (queued, input set 3) differs from the reference")
    results["eager"].samples.append(1e-3)
    results["broken"].error = RuntimeError("no")
    line = Lineup([Contender(key, lambda x: x) for key in results])
    fake = FakeTracer({"custom": trace.parse_chrome(Chrome.call(unjoined))})
    untrusted = "ModelNew's calls could be timed only by the round trip to its process"
    _traces(line, SimpleNamespace(results=results), [torch.ones(3)], fake, untrusted)
    assert fake.calls == ["custom", "eager"]
    failure = results["custom"].failure
    assert failure.startswith("work escaped the calling stream (kernel trace): kernel side_kernel"), failure
    assert failure.endswith(f"; {untrusted}; output of timed round 1 (queued, input set 3) differs from the reference")
    assert results["eager"].failure is None


def test_a_custom_failed_untimed_as_far_slower_is_not_traced_again():
    """Its gate is decided in its warm-up (engine.Config.far_slower): one more of its slow calls adds nothing."""
    from types import SimpleNamespace

    from pytest_cudaopt.perf.lineup import Lineup
    from pytest_cudaopt.perf.measurement import ContenderResult
    from pytest_cudaopt.perf.verdict import _traces

    results = {"custom": ContenderResult("custom", "ModelNew"), "compile": ContenderResult("compile", "compiled")}
    results["custom"].fail("far slower than compiled: ...; not timed further")
    results["custom"].untimed = True
    results["compile"].samples.append(1e-3)
    fake = FakeTracer({})
    _traces(Lineup([Contender(key, lambda x: x) for key in results]), SimpleNamespace(results=results),
            [torch.ones(3)], fake)
    assert fake.calls == ["compile"]


def test_a_custom_failed_untimed_as_far_slower_gives_that_reason_first_then_its_clock_audits():
    """An honest slow kernel's few warm-up calls may all fall short of the judging side's window (a 200 ms call
    reported 1.2 ms under it on an H100): the audit cannot make a far slower contender any faster."""
    from types import SimpleNamespace

    from pytest_cudaopt.perf.lineup import Lineup
    from pytest_cudaopt.perf.measurement import ContenderResult
    from pytest_cudaopt.perf.verdict import _traces

    results = {"custom": ContenderResult("custom", "ModelNew")}
    results["custom"].fail("far slower than compiled: ...; not timed further")
    results["custom"].untimed = True
    _traces(Lineup([Contender("custom", lambda x: x)]), SimpleNamespace(results=results), [torch.ones(3)], None,
            "ModelNew's own timer under-reports its time")
    assert results["custom"].failure == ("far slower than compiled: ...; not timed further; "
                                         "ModelNew's own timer under-reports its time")
