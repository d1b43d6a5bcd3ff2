"""The kernel trace: one profiled call per contender, its kernels with stream, grid and duration, and stream escapes."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.autograd.profiler
import torch.profiler

# The ranges and the export are the candidate's process's too (it traces ModelNew): one copy, there.
from pytest_cudaopt.candidate.observe import BEGIN, CALL, END, LEAD, export_events
from pytest_cudaopt.perf.clocks import GpuLead, host_time, synchronize_device
from pytest_cudaopt.perf.engine import Contender
from pytest_cudaopt.perf.stats import format_seconds
from pytest_cudaopt.primitives.tensors import clone_inputs

# Bound at import, before any workdir code runs (see clocks.py): escapes are found by it. The autograd
# profiler, not torch.profiler's start, which imports Inductor and Dynamo (~900 modules: seconds in a worker).
_profile = torch.autograd.profiler.profile
_record_function = torch.profiler.record_function

OWN_RANGES = (LEAD, BEGIN, END)
# Chrome-trace categories of device activity, and of the host calls that launch it.
DEVICE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Timestamps are in microseconds with nanosecond digits; differences below this are ties.
TIE = 50e-9


@dataclass(frozen=True)
class Kernel:
    """One piece of device work: a kernel, a copy or a memset (`kind`), times in seconds (the trace's clock)."""

    name: str
    stream: int
    start: float
    duration: float
    kind: str = "kernel"
    grid: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def short_name(self) -> str:
        return short_name(self.name) if self.kind == "kernel" else self.name

    def describe(self) -> str:
        grid = f", grid {'x'.join(map(str, self.grid))}" if self.grid else ""
        return f"{self.kind} {self.short_name}{grid} on stream {self.stream}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "stream": self.stream, "start_s": self.start,
                "duration_s": self.duration, "grid": list(self.grid) if self.grid else None,
                "block": list(self.block) if self.block else None}


@dataclass(frozen=True)
class Escape:
    """Work of the call on another stream that the calling stream does not bracket."""

    kernel: Kernel
    reason: str

    def describe(self, calling_stream: int | None) -> str:
        return (f"{self.kernel.describe()} (calling stream {calling_stream}, "
                f"{format_seconds(self.kernel.duration)}) {self.reason}")


@dataclass
class Trace:
    """The device work of one profiled call. `window`: where the calling stream reached and left the call."""

    kernels: list[Kernel] = field(default_factory=list)
    calling_stream: int | None = None
    window: tuple[float, float] | None = None
    host_ahead: bool | None = None    # the host enqueued the call before the GPU got to it
    error: str | None = None          # why there is no trace

    @property
    def kernel_sum(self) -> float:
        """Summed duration of every kernel, copy and memset of the call."""
        return sum(k.duration for k in self.kernels)

    @property
    def count(self) -> int:
        return sum(1 for k in self.kernels if k.kind == "kernel")

    @property
    def streams(self) -> list[int]:
        return sorted({k.stream for k in self.kernels})

    def top(self, n: int = 5) -> list[tuple[str, int, float, Kernel]]:
        """(short name, calls, total seconds, first kernel) by total time, largest first."""
        groups: dict[str, list[Kernel]] = defaultdict(list)
        for k in self.kernels:
            groups[k.short_name].append(k)
        ranked = sorted(groups.items(), key=lambda item: -sum(k.duration for k in item[1]))
        return [(name, len(ks), sum(k.duration for k in ks), ks[0]) for name, ks in ranked[:n]]

    def escapes(self) -> list[Escape]:
        """Device work of the call on another stream that the calling stream does not bracket, at any duration.

        With the host ahead, side-stream work ending after END was not joined back, and work starting
        before BEGIN did not wait for the inputs. Not caught: an unjoined kernel inside the calling
        stream's own work (it is timed; its result races)."""
        if self.error or self.calling_stream is None or self.window is None:
            return []
        begin, end = self.window
        found = []
        for k in self.kernels:
            if k.stream == self.calling_stream:
                continue
            if k.end > end + TIE:
                found.append(Escape(k, f"ended {format_seconds(k.end - end)} after the calling stream's "
                                       "work had continued past the call: it was not joined back before "
                                       "the call returned"))
            elif k.start < begin - TIE:
                found.append(Escape(k, f"started {format_seconds(begin - k.start)} before the calling "
                                       "stream reached the call: it does not wait for the calling stream"))
        return found

    def escape_message(self) -> str | None:
        return escape_failure(self)

    def summary(self) -> str:
        """'3 kernels, 1 copy on 1 stream' style count."""
        kinds = Counter(k.kind for k in self.kernels)
        parts = [f"{kinds[kind]} {kind}{'s' if kinds[kind] != 1 else ''}"
                 for kind in ("kernel", "memcpy", "memset") if kinds[kind] or kind == "kernel"]
        triton = sum(1 for k in self.kernels if k.kind == "kernel" and k.short_name.startswith("triton"))
        if triton:
            parts[0] += f" ({triton} Triton)"
        streams = len(self.streams)
        return f"{', '.join(parts)} on {streams} stream{'s' if streams != 1 else ''}"

    def to_json(self) -> dict[str, Any]:
        if self.error:
            return {"error": self.error}
        return {"calling_stream": self.calling_stream, "kernel_sum_s": self.kernel_sum,
                "kernels_n": self.count, "streams": self.streams, "host_ahead": self.host_ahead,
                "window_s": list(self.window) if self.window else None,
                "escapes": [{"kernel": e.kernel.to_json(), "reason": e.reason} for e in self.escapes()],
                "kernels": [k.to_json() for k in self.kernels]}


def short_name(name: str, limit: int = 60) -> str:
    """A kernel's name without 'void ', template arguments and parameters, at most `limit` chars."""
    text = name.strip().replace("(anonymous namespace)::", "")
    if text.startswith("void "):
        text = text[5:]
    for stop in ("<", "("):
        if stop in text and not text.startswith(stop):
            text = text[:text.index(stop)]
    text = text.rsplit("::", 1)[-1] if "::" in text and len(text) > limit else text
    return text if len(text) <= limit else text[:limit - 3] + "..."


def escape_failure(trace: Trace, limit: int = 3) -> str | None:
    """The failure message for a trace with escapes, else None."""
    escapes = trace.escapes()
    if not escapes:
        return None
    shown = "; ".join(e.describe(trace.calling_stream) for e in escapes[:limit])
    more = f" (and {len(escapes) - limit} more)" if len(escapes) > limit else ""
    return (f"work escaped the calling stream (kernel trace): {shown}{more}; launch on "
            "torch.cuda.current_stream(), or join side streams back before returning (record an "
            "event on the side stream and make the current stream wait on it)")


def parse_chrome(events: Iterable[Mapping[str, Any]]) -> Trace:
    """The call's device work from Chrome-trace events, but OWN_RANGES'; BEGIN and END give stream and window."""
    events = [e for e in events if isinstance(e, Mapping) and e.get("ph", "X") == "X"]
    ranges: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("name") in (*OWN_RANGES, CALL):
            start = float(e.get("ts", 0.0))
            ranges[e["name"]].append((start, start + float(e.get("dur", 0.0))))
    launches = [(float(e.get("ts", 0.0)), (e.get("args") or {}).get("correlation"))
                for e in events if e.get("cat") in LAUNCH_CATEGORIES]

    def correlations(name: str) -> set[Any]:
        return {corr for ts, corr in launches if corr is not None
                and any(lo <= ts <= hi for lo, hi in ranges.get(name, ()))}

    own = {name: correlations(name) for name in OWN_RANGES}
    mine: list[Kernel] = []
    markers: dict[str, list[Kernel]] = {BEGIN: [], END: []}
    for e in events:
        kind = DEVICE_KINDS.get(e.get("cat"))
        if kind is None:
            continue
        args = e.get("args") or {}
        kernel = Kernel(name=str(e.get("name", "?")), stream=int(args.get("stream", -1)),
                        start=float(e.get("ts", 0.0)) * 1e-6, duration=float(e.get("dur", 0.0)) * 1e-6,
                        kind=kind, grid=_dims(args.get("grid")), block=_dims(args.get("block")))
        corr = args.get("correlation")
        owner = next((name for name in OWN_RANGES if corr is not None and corr in own[name]), None)
        if owner is None:
            mine.append(kernel)
        elif owner in markers:
            markers[owner].append(kernel)
    mine.sort(key=lambda k: k.start)
    if not markers[BEGIN] or not markers[END]:
        missing = " and ".join(n for n in (BEGIN, END) if not markers[n])
        return Trace(kernels=mine, error=f"the profiler recorded no kernel for the tracer's {missing} "
                                         "marker (is CUPTI available to torch.profiler?)")
    begin = max(markers[BEGIN], key=lambda k: k.end)
    end = min(markers[END], key=lambda k: k.start)
    if begin.stream != end.stream:
        return Trace(kernels=mine, error=f"the markers before and after the call ran on different "
                                         f"streams ({begin.stream}, {end.stream})")
    return Trace(kernels=mine, calling_stream=begin.stream, window=(begin.end, end.start))


def _dims(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) for v in value):
        return tuple(int(v) for v in value)
    return None


class ProfilerTracer:
    """One call of a contender under torch.profiler (CUPTI): a lead spin, the L2 flush, BEGIN, the call, END."""

    def __init__(self, device: Any):
        self.device = torch.device(device)
        self.lead = GpuLead(self.device)
        l2 = int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or 0)
        self.flush_bytes = max(2 * l2, 64 << 20)
        self._flush: torch.Tensor | None = None
        self._marker: torch.Tensor | None = None

    def warm(self) -> None:
        """The profiler started and stopped once: its first start (CUPTI's set-up) is not paid inside a turn."""
        synchronize_device()
        with profiling(self.device):
            synchronize_device()

    def trace(self, contender: Contender, args: Sequence[Any], *, lead: float = 2e-3) -> Trace:
        """The call's trace; the candidate is traced where it runs, which sends the events back as data."""
        if contender.candidate is not None:
            events, ahead = contender.candidate.trace_events(list(args), lead, self.flush_bytes)
        else:
            events, ahead = self.events(contender, args, lead=lead)
        found = parse_chrome(events)
        found.host_ahead = ahead
        return found

    def events(self, contender: Contender, args: Sequence[Any], *, lead: float = 2e-3) -> tuple[list[dict], bool]:
        """The Chrome-trace events of one profiled call, and whether the host stayed ahead."""
        if self._flush is None:
            self._flush = torch.empty(self.flush_bytes // 4, dtype=torch.int32, device=self.device)
            self._marker = torch.zeros(1, dtype=torch.int32, device=self.device)
            self.lead.calibrate()
        synchronize_device()
        with profiling(self.device) as prof:
            with _record_function(LEAD):
                self.lead.enqueue(lead)
                self._flush.zero_()
            with _record_function(BEGIN):
                self._marker.fill_(1)
            t0 = host_time()
            with contender.context(), _record_function(CALL):
                output = contender.fn(*args)
            host = host_time() - t0
            with _record_function(END):
                self._marker.fill_(2)
            synchronize_device()
        del output
        return export_events(prof), host < lead


def profiling(device: torch.device):
    """torch's profiler (Kineto) recording host activity and `device`'s (CUPTI on CUDA)."""
    return _profile(use_kineto=True, use_cpu=True, use_device=None if device.type == "cpu" else device.type)


def trace_lineup(contenders: Sequence[Contender], args: Sequence[Any], tracer: Any,
                 leads: Mapping[str, float] | None = None) -> dict[str, Trace]:
    """One traced call of each contender on clones of `args` (a failed trace: a Trace with `error`)."""
    out: dict[str, Trace] = {}
    for contender in contenders:
        lead = min(0.1, max(2e-3, 2 * (leads or {}).get(contender.key, 0.0) + 1e-3))
        try:
            found = tracer.trace(contender, clone_inputs(args), lead=lead)
        except Exception as exc:
            found = Trace(error=f"not traced: {type(exc).__name__}: {exc}")
        if found is not None:
            out[contender.key] = found
    return out


def default_tracer(device: Any, enabled: bool = True) -> ProfilerTracer | None:
    """ProfilerTracer on a CUDA device when enabled, else None (no trace)."""
    if not enabled or torch.device(device).type != "cuda":
        return None
    return ProfilerTracer(device)
