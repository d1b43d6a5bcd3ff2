"""The clocks of the timing engine: CUDA events (device time and latency), the host's perf_counter; and the timing functions bound before any workdir code runs."""

from __future__ import annotations

import time
from typing import Any, Callable, ContextManager, Protocol, Sequence

import torch
import torch.autograd.profiler

from pytest_cudaopt.perf.runs import CandidateCall, Run, Sample, batches, candidate_batches, time_calls
from pytest_cudaopt.perf.stats import median
from pytest_cudaopt.remote.timing import TimingError  # noqa: F401 - raised here, imported from here

# Bound at first import (bind_timing(), before any workdir code runs), so that model_new.py cannot
# replace what measures a contender (torch.cuda.synchronize = noop); `tampered()` reports replacements.
_perf_counter = time.perf_counter
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed_ms = torch.cuda.Event.elapsed_time
_event_synchronize = torch.cuda.Event.synchronize
# torch.cuda.synchronize() is a Python wrapper around this (cudaDeviceSynchronize).
_device_synchronize = getattr(torch._C, "_cuda_synchronize", None) or torch.cuda.synchronize
_current_stream = torch.cuda.current_stream
_set_stream = torch.cuda.set_stream
_device_properties = torch.cuda.get_device_properties
_CUDAGraph = torch.cuda.CUDAGraph
_graph = torch.cuda.graph
_torch_empty = torch.empty
_gpu_sleep = getattr(torch.cuda, "_sleep", None)  # a kernel that spins for a number of clock cycles

_WATCHED: dict[str, tuple[Any, str, Any]] = {
    f"{prefix}.{attr}": (owner, attr, getattr(owner, attr, None)) for prefix, owner, attrs in (
        ("time", time, ["perf_counter"]), ("torch.cuda", torch.cuda, ["synchronize", "Event"]),
        ("torch.cuda.Event", torch.cuda.Event, ["record", "elapsed_time", "synchronize"]),
        ("torch.cuda", torch.cuda, ["current_stream", "graph", "_sleep"]),
        ("torch.autograd.profiler", torch.autograd.profiler, ["profile"])) for attr in attrs}


def host_time() -> float:
    """time.perf_counter as it was when this module was imported."""
    return _perf_counter()


def synchronize_device() -> None:
    """Wait for all work on the current CUDA device (every stream)."""
    _device_synchronize()


def tampered() -> list[str]:
    """Names of the timing functions that were replaced since this module was imported."""
    return [name for name, (owner, attr, bound) in _WATCHED.items() if getattr(owner, attr, None) is not bound]


class GpuLead:
    """Keeps the host ahead of the GPU: `enqueue(seconds)` spins a kernel about that long on the current stream."""

    def __init__(self, device: Any):
        self.device = device
        self.cycles_per_second = 0.0

    def calibrate(self, cycles: int = 1_000_000) -> None:
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        stream = _current_stream(self.device)
        values = []
        for _ in range(3):
            _device_synchronize()
            _event_record(start, stream)
            _gpu_sleep(cycles)
            _event_record(end, stream)
            _event_synchronize(end)
            values.append(_event_elapsed_ms(start, end) / 1e3)
        self.cycles_per_second = cycles / max(median(values), 1e-9)

    def enqueue(self, seconds: float) -> None:
        if not self.cycles_per_second:
            self.calibrate()
        _gpu_sleep(max(1, int(seconds * self.cycles_per_second)))


class Clock(Protocol):
    """What `measure` needs of a clock: `queue(runs)` device time, `time(key, run)` latency (and the escape check)."""

    name: str
    flush_bytes: int
    escape_floor: float
    graphs: bool                # a contender's calls replay a captured CUDA graph
    max_batch: int | None       # the most calls of a contender a queued pass holds (None: the engine's)
    queued_rounds: int          # queued passes so far ...
    behind_rounds: int          # ... and those where the host fell behind the device

    def now(self) -> float: ...

    def prepare(self) -> None: ...

    def runner(self, fn: Callable[..., Any], scope: Callable[[], ContextManager], args: Sequence[Any]) -> Callable[[], Any]: ...

    def queue(self, runs: Sequence[Run]) -> list[Any]: ...

    def time(self, key: str, run: Callable[[], Any], call: CandidateCall | None = None) -> Sample: ...


class CudaClock:
    """CUDA events on the current stream, a cold L2 before every batch of timed calls (docs/timing.md).
    At most 16 calls a batch: batches of 32 did not tighten the timed window's allowance."""

    max_batch: int | None = 16
    name = "cuda-events"
    min_lead = 200e-6
    max_lead = 0.1

    def __init__(self, device: Any = None, *, graphs: bool = False):
        self.device = torch.device("cuda") if device is None else torch.device(device)
        self.graphs = graphs
        self._flush: torch.Tensor | None = None
        self._start = None
        self._end = None
        self._events: list[Any] = []
        self.escape_floor = 0.0
        self.lead = GpuLead(self.device)
        self._hosts: list[float] = []      # host enqueue time of recent rounds
        self.queued_rounds = 0
        self.behind_rounds = 0

    def now(self) -> float:
        return _perf_counter()

    @property
    def flush_bytes(self) -> int:
        return 0 if self._flush is None else self._flush.numel() * self._flush.element_size()

    def prepare(self) -> None:
        l2 = int(getattr(_device_properties(self.device), "L2_cache_size", 0) or 0)
        # At least 2x L2 (at least 64 MiB if the property is missing), in int32 words.
        nbytes = max(2 * l2, 64 << 20)
        self._flush = _torch_empty(nbytes // 4, dtype=torch.int32, device=self.device)
        self._start = _Event(enable_timing=True)
        self._end = _Event(enable_timing=True)
        self.escape_floor = self._calibrate_escape()
        self.lead.calibrate()

    def flush(self) -> None:
        """Overwrite the flush buffer (evicts L2); enqueued on the current stream."""
        self._flush.zero_()

    def _calibrate_escape(self, runs: int = 30) -> float:
        """What a device-wide synchronise costs on an idle device (the escape time of one tiny kernel)."""
        probe = self._flush[:1]
        return median([self.time("escape-probe", lambda: probe.add_(1)).escaped for _ in range(runs)])

    def runner(self, fn: Callable[..., Any], scope: Callable[[], ContextManager],
               args: Sequence[Any]) -> Callable[[], Any]:
        if not self.graphs:
            return lambda: fn(*args)
        graph = _CUDAGraph()
        with scope():
            # As torch.cuda.graph asks: a few calls on a side stream before the capture.
            side = torch.cuda.Stream(self.device)
            side.wait_stream(_current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn(*args)
            _current_stream(self.device).wait_stream(side)
            with _graph(graph):
                static_output = fn(*args)
        _device_synchronize()
        return lambda: (graph.replay(), static_output)[1]

    def _lead_seconds(self) -> float:
        if not self._hosts:
            return 2e-3
        return min(self.max_lead, max(self.min_lead, 1.5 * max(self._hosts) + 100e-6))

    def queue(self, runs: Sequence[Run]) -> list[Any]:
        """Device time of each run; the candidate's runs are timed as batches by the candidate, after the others."""
        local = [i for i, r in enumerate(runs) if r.call is None]
        found = dict(zip(local, self._queue_local([runs[i] for i in local]))) if local else {}
        for indices in candidate_batches(runs):
            self.flush()
            found.update(zip(indices, time_calls([runs[i].call for i in indices])))
        return [found[i] for i in range(len(runs))]

    def _queue_local(self, runs: Sequence[Run]) -> list[Any]:
        groups = batches(runs)
        while len(self._events) < len(runs) + len(groups):
            self._events.append(_Event(enable_timing=True))
        _device_synchronize()
        stream = _current_stream(self.device)
        lead = self._lead_seconds()
        self.lead.enqueue(lead)
        t0 = _perf_counter()
        outcomes: list[Any] = []
        bounds: list[tuple[Any, Any]] = []   # (event before, event after) of each run
        events = iter(self._events)
        for batch in groups:
            self.flush()
            before = next(events)
            _event_record(before, stream)
            for key, run, scope, _ in batch:
                after = next(events)
                try:
                    with scope():
                        output = run()
                    self._check_stream(key, stream)
                    outcomes.append(output)
                except Exception as exc:
                    outcomes.append(exc)
                _event_record(after, stream)
                bounds.append((before, after))
                before = after
        host = _perf_counter() - t0
        _device_synchronize()
        self._hosts = (self._hosts + [host])[-8:]
        self.queued_rounds += 1
        self.behind_rounds += host > lead
        samples: list[Any] = []
        for outcome, (before, after) in zip(outcomes, bounds):
            if isinstance(outcome, BaseException):
                samples.append(outcome)
                continue
            seconds = _event_elapsed_ms(before, after) / 1e3
            samples.append(Sample(seconds=seconds, wall=seconds, escaped=0.0, output=outcome))
        return samples

    def time(self, key: str, run: Callable[[], Any], call: CandidateCall | None = None) -> Sample:
        _device_synchronize()
        self.flush()
        if call is not None:  # a batch of one, timed by the candidate
            return _first(time_calls([call]))
        _device_synchronize()
        stream = _current_stream(self.device)
        t0 = _perf_counter()
        _event_record(self._start, stream)
        output = run()
        _event_record(self._end, stream)
        _event_synchronize(self._end)
        t1 = _perf_counter()
        _device_synchronize()
        t2 = _perf_counter()
        self._check_stream(key, stream)
        seconds = _event_elapsed_ms(self._start, self._end) / 1e3
        return Sample(seconds=seconds, wall=t2 - t0, escaped=t2 - t1, output=output)

    def _check_stream(self, key: str, stream: Any) -> None:
        if not _current_stream(self.device) == stream:
            _set_stream(stream)
            raise TimingError(f"{key} left a different CUDA stream current after its call; "
                              "launch on torch.cuda.current_stream() and do not change it")


def _first(samples: list[Any]) -> Sample:
    if isinstance(samples[0], BaseException):
        raise samples[0]
    return samples[0]


class PerfCounterClock:
    """Host wall clock around each call, for CPU contenders (nothing is flushed, nothing can escape)."""

    name = "perf-counter"
    escape_floor = 0.0
    flush_bytes = 0
    graphs = False
    max_batch = None
    queued_rounds = behind_rounds = 0

    def now(self) -> float:
        return _perf_counter()

    def prepare(self) -> None:
        pass

    def runner(self, fn: Callable[..., Any], scope: Callable[[], ContextManager],
               args: Sequence[Any]) -> Callable[[], Any]:
        return lambda: fn(*args)

    def queue(self, runs: Sequence[Run]) -> list[Any]:
        """Each run timed alone, a candidate's as batches."""
        grouped = {i: batch for batch in candidate_batches(runs) for i in batch}
        samples: dict[int, Any] = {}
        for i, (key, run, scope, _) in enumerate(runs):
            if i in grouped:
                if i not in samples:
                    samples.update(zip(grouped[i], time_calls([runs[j].call for j in grouped[i]])))
                continue
            try:
                with scope():
                    samples[i] = self.time(key, run)
            except Exception as exc:
                samples[i] = exc
        return [samples[i] for i in range(len(runs))]

    def time(self, key: str, run: Callable[[], Any], call: CandidateCall | None = None) -> Sample:
        if call is not None:  # the candidate's figure, checked against this process's clock
            return _first(time_calls([call]))
        t0 = _perf_counter()
        output = run()
        seconds = _perf_counter() - t0
        return Sample(seconds=seconds, wall=seconds, escaped=0.0, output=output)


def default_clock(device: Any, *, cuda_graph: bool = False):
    """CudaClock for a CUDA device, PerfCounterClock otherwise."""
    if torch.device(device).type == "cuda":
        return CudaClock(device, graphs=cuda_graph)
    return PerfCounterClock()
