"""The timing engine: every contender timed alike, interleaved, cache-flushed, until the medians are tight."""

from __future__ import annotations

import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Sequence

import torch

from pytest_cudaopt.stats import Summary, median, relative_standard_error

# What measures a contender is bound here, when the plugin is imported and before any
# workdir code runs, so that model_new.py cannot replace it (torch.cuda.synchronize = noop).
# `tampered()` reports any of the public names that were replaced after this point.
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

_WATCHED: dict[str, tuple[Any, str, Any]] = {
    "time.perf_counter": (time, "perf_counter", time.perf_counter),
    "torch.cuda.synchronize": (torch.cuda, "synchronize", torch.cuda.synchronize),
    "torch.cuda.Event": (torch.cuda, "Event", torch.cuda.Event),
    "torch.cuda.Event.record": (torch.cuda.Event, "record", torch.cuda.Event.record),
    "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time", torch.cuda.Event.elapsed_time),
    "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize", torch.cuda.Event.synchronize),
    "torch.cuda.current_stream": (torch.cuda, "current_stream", torch.cuda.current_stream),
    "torch.cuda.graph": (torch.cuda, "graph", torch.cuda.graph),
}


def host_time() -> float:
    """time.perf_counter as it was when this module was imported."""
    return _perf_counter()


def synchronize_device() -> None:
    """Wait for all work on the current CUDA device (every stream)."""
    _device_synchronize()


def tampered() -> list[str]:
    """Names of the timing functions that were replaced since this module was imported."""
    return [name for name, (owner, attr, bound) in _WATCHED.items()
            if getattr(owner, attr, None) is not bound]


# ---------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------
# Contenders, samples, settings


@dataclass
class Contender:
    """One thing to time. `key` is stable ("eager", "compile", "custom", "peer:sdpa",
    "precision-matched") and `label` is what tables show. `scope` (if any) is entered around
    every call but outside the measured region (e.g. TF32 allowed for one baseline only)."""

    key: str
    fn: Callable[..., Any]
    label: str = ""
    scope: Callable[[], ContextManager] | None = None
    check: bool = True

    def __post_init__(self) -> None:
        self.label = self.label or self.key

    def context(self) -> ContextManager:
        return self.scope() if self.scope is not None else nullcontext()


@dataclass(frozen=True)
class Sample:
    """One timed run: `seconds` measured by the clock (CUDA events on device), `wall` the
    host time from before the call to the end of a device-wide synchronise, `escaped` the
    host time the device stayed busy after the measured stream had finished."""

    seconds: float
    wall: float
    escaped: float
    output: Any = None


@dataclass(frozen=True)
class Config:
    """How long and how carefully to time. `from_settings` maps the cudaopt options."""

    warmup: float = 1.0            # seconds of untimed calls per contender (and >= min_warmup_runs)
    max_time: float = 20.0         # seconds of timed rounds; the round running when it is hit completes
    target_rse: float = 0.005      # stop once every median's relative standard error is below this
    min_runs: int = 50             # timed runs per contender before the stop rule may fire
    min_warmup_runs: int = 3
    max_rounds: int = 100_000
    check_fraction: float = 0.05   # share of timed runs (beyond one per input set) whose output is checked
    escape_abs: float = 5e-6       # seconds of device work after the stream's end event that are tolerated ...
    escape_rel: float = 0.05       # ... plus this share of the contender's median
    seed: int = 0                  # which runs are checked

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> "Config":
        values = dict(warmup=settings.warmup, max_time=settings.max_time,
                      target_rse=settings.target_rse, min_runs=settings.min_runs)
        values.update(overrides)
        return cls(**values)


# ---------------------------------------------------------------------------------------
# Clocks: CUDA events (the real one), perf_counter (CPU contenders), fake (unit tests)


class CudaClock:
    """CUDA events on the current stream around each call, on an idle device with a cold L2.

    One run: synchronise the device, zero a buffer twice the size of L2 (the flush), wait
    for it, record `start` on the current stream, call, record `end`, wait for `end`
    (host time t1), synchronise the whole device (t2). The event time is the measurement;
    t2 - t1 is how long work launched by the call kept the device busy after the measured
    stream had finished (a side stream, deferred work). Starting from an idle device means
    side-stream work cannot hide behind the flush: it either ends inside [start, end] and is
    measured, or it ends after `end` and shows in t2 - t1. The price is that the event time
    includes the host's launch latency of the first kernel (a few microseconds; the
    CUDA-graph mode removes it)."""

    name = "cuda-events"

    def __init__(self, device: Any = None, *, graphs: bool = False, flush_factor: int = 2):
        self.device = torch.device("cuda") if device is None else torch.device(device)
        self.graphs = graphs
        self.flush_factor = flush_factor
        self._flush: torch.Tensor | None = None
        self._start = None
        self._end = None
        self.escape_floor = 0.0

    def now(self) -> float:
        return _perf_counter()

    @property
    def flush_bytes(self) -> int:
        return 0 if self._flush is None else self._flush.numel() * self._flush.element_size()

    def prepare(self) -> None:
        l2 = int(getattr(_device_properties(self.device), "L2_cache_size", 0) or 0)
        # At least 2x L2 (at least 64 MiB if the property is missing), in int32 words.
        nbytes = max(self.flush_factor * l2, 64 << 20)
        self._flush = _torch_empty(nbytes // 4, dtype=torch.int32, device=self.device)
        self._start = _Event(enable_timing=True)
        self._end = _Event(enable_timing=True)
        self.escape_floor = self._calibrate_escape()

    def flush(self) -> None:
        """Overwrite the flush buffer (evicts L2); enqueued on the current stream."""
        self._flush.zero_()

    def _calibrate_escape(self, runs: int = 30) -> float:
        """The escape time of a call that does one tiny kernel on the current stream: what
        a device-wide synchronise costs on a device that is already idle."""
        probe = self._flush[:1]
        values = [self.time("escape-probe", lambda: probe.add_(1)).escaped for _ in range(runs)]
        return median(values)

    def runner(self, contender: Contender, args: Sequence[Any]) -> Callable[[], Any]:
        fn = contender.fn
        if not self.graphs:
            return lambda: fn(*args)
        graph = _CUDAGraph()
        with contender.context():
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

    def time(self, key: str, run: Callable[[], Any]) -> Sample:
        _device_synchronize()
        self.flush()
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
        if not _current_stream(self.device) == stream:
            _set_stream(stream)
            raise TimingError(f"{key} left a different CUDA stream current after its call; "
                              "launch on torch.cuda.current_stream() and do not change it")
        seconds = _event_elapsed_ms(self._start, self._end) / 1e3
        return Sample(seconds=seconds, wall=t2 - t0, escaped=t2 - t1, output=output)


class PerfCounterClock:
    """Host wall clock around each call, for CPU contenders (used to exercise the
    machinery on CPU workdirs; nothing is flushed and nothing can escape)."""

    name = "perf-counter"
    escape_floor = 0.0
    flush_bytes = 0

    def now(self) -> float:
        return _perf_counter()

    def prepare(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def runner(self, contender: Contender, args: Sequence[Any]) -> Callable[[], Any]:
        fn = contender.fn
        return lambda: fn(*args)

    def time(self, key: str, run: Callable[[], Any]) -> Sample:
        t0 = _perf_counter()
        output = run()
        seconds = _perf_counter() - t0
        return Sample(seconds=seconds, wall=seconds, escaped=0.0, output=output)


class FakeClock:
    """Scripted durations per contender key, for tests: `durations[key]` is a number or a
    sequence cycled run by run; `escaped[key]` likewise. Virtual time advances by each
    duration (plus `overhead`), so warm-up and the time cap behave as with a real clock.
    The calls are real (outputs are checked); `calls` lists the keys in the order run."""

    name = "fake"
    flush_bytes = 0

    def __init__(self, durations: Mapping[str, Any], *, escaped: Mapping[str, Any] | None = None,
                 default: float | None = None, overhead: float = 0.0, escape_floor: float = 0.0):
        self.durations = {key: _cycle(value) for key, value in durations.items()}
        self.escapes = {key: _cycle(value) for key, value in (escaped or {}).items()}
        self.default = default
        self.overhead = overhead
        self.escape_floor = escape_floor
        self.virtual = 0.0
        self.calls: list[str] = []

    def now(self) -> float:
        return self.virtual

    def prepare(self) -> None:
        pass

    def runner(self, contender: Contender, args: Sequence[Any]) -> Callable[[], Any]:
        fn = contender.fn
        return lambda: fn(*args)

    def time(self, key: str, run: Callable[[], Any]) -> Sample:
        output = run()
        self.calls.append(key)
        if key in self.durations:
            seconds = next(self.durations[key])
        elif self.default is not None:
            seconds = self.default
        else:
            raise KeyError(f"FakeClock has no duration for contender {key!r}")
        escaped = next(self.escapes[key]) if key in self.escapes else 0.0
        self.virtual += seconds + escaped + self.overhead
        return Sample(seconds=seconds, wall=seconds + escaped, escaped=escaped, output=output)


def _cycle(value: Any):
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    while True:
        yield from values


def default_clock(device: Any, *, cuda_graph: bool = False):
    """CudaClock for a CUDA device, PerfCounterClock otherwise."""
    if torch.device(device).type == "cuda":
        return CudaClock(device, graphs=cuda_graph)
    return PerfCounterClock()


# ---------------------------------------------------------------------------------------
# The engine


class TimingError(RuntimeError):
    """A contender cannot be timed as it is (the message says why)."""


@dataclass
class ContenderResult:
    key: str
    label: str
    samples: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    escapes: list[float] = field(default_factory=list)
    warmup_runs: int = 0
    warmup_seconds: float = 0.0
    checked: int = 0
    failure: str | None = None
    error: BaseException | None = field(default=None, repr=False)  # what the contender raised

    @property
    def summary(self) -> Summary:
        return Summary.of(self.samples)

    @property
    def wall_median(self) -> float:
        return median(self.walls) if self.walls else math.nan

    @property
    def escape_median(self) -> float:
        return median(self.escapes) if self.escapes else math.nan

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason

    def to_json(self) -> dict[str, Any]:
        s = self.summary
        return {"key": self.key, "label": self.label, "n": s.n, "median_s": _num(s.median),
                "q1_s": _num(s.q1), "q3_s": _num(s.q3), "iqr_s": _num(s.iqr), "rse": _num(s.rse),
                "min_s": _num(s.minimum), "wall_median_s": _num(self.wall_median),
                "escape_median_s": _num(self.escape_median), "warmup_runs": self.warmup_runs,
                "warmup_s": self.warmup_seconds, "outputs_checked": self.checked,
                "failure": self.failure}


def _num(value: float) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else value


@dataclass
class Measurement:
    results: dict[str, ContenderResult]
    schedule: list[tuple[int, str, int]]  # (round, contender key, input slot) in run order
    rounds: int
    stop_reason: str                      # "target_rse" | "max_time" | "max_rounds" | "all failed"
    seconds: float
    clock: str
    flush_bytes: int
    escape_floor: float
    config: Config

    def __getitem__(self, key: str) -> ContenderResult:
        return self.results[key]

    def to_json(self) -> dict[str, Any]:
        return {"clock": self.clock, "rounds": self.rounds, "stop_reason": self.stop_reason,
                "seconds": self.seconds, "flush_bytes": self.flush_bytes,
                "escape_floor_s": self.escape_floor,
                "target_rse": self.config.target_rse, "max_time_s": self.config.max_time,
                "warmup_s": self.config.warmup,
                "contenders": [r.to_json() for r in self.results.values()]}


Compare = Callable[[Any, Any], "str | None"]


def precise_enough(samples: Sequence[Sequence[float]], config: Config) -> bool:
    """The stop rule: every contender has at least `min_runs` samples and the relative
    standard error of its median is at most `target_rse`."""
    return all(len(values) >= config.min_runs
               and relative_standard_error(values) <= config.target_rse for values in samples)


def round_order(keys: Sequence[str], round_index: int) -> list[str]:
    """Contenders of one round: the list rotated by the round number (A B C, B C A, C A B,
    ...), so that each runs first, and after each other one, equally often."""
    k = round_index % len(keys)
    return list(keys[k:]) + list(keys[:k])


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def refill_inputs(target: Sequence[Any], source: Sequence[Any]) -> None:
    """Copy the values of one input set into another's tensors, in place (same storage)."""
    for dst, src in zip(target, source):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)


def default_compare(output: Any, expected: Any, *, atol: float = 1e-2, rtol: float = 1e-2) -> str | None:
    """None when `output` matches `expected` (same structure, |a-e| <= atol + rtol|e|)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(output, torch.Tensor):
            return f"returned {type(output).__name__}, expected a tensor"
        if output.shape != expected.shape:
            return f"shape {tuple(output.shape)}, expected {tuple(expected.shape)}"
        a = output.detach().to("cpu", torch.float64)
        e = expected.detach().to("cpu", torch.float64)
        bad = ~torch.isclose(a, e, atol=atol, rtol=rtol, equal_nan=True)
        if bool(bad.any()):
            worst = int(((a - e).abs().nan_to_num(math.inf) * bad).flatten().argmax())
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), a.shape))
            return (f"{int(bad.sum())} of {bad.numel()} elements differ, e.g. at {index}: "
                    f"{a[index].item():.6g} vs {e[index].item():.6g}")
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(output, (list, tuple)) or len(output) != len(expected):
            return f"returned {type(output).__name__}, expected {type(expected).__name__} of {len(expected)}"
        for i, (o, e) in enumerate(zip(output, expected)):
            problem = default_compare(o, e, atol=atol, rtol=rtol)
            if problem:
                return f"output[{i}]: {problem}"
        return None
    return None if output == expected else f"returned {output!r}, expected {expected!r}"


def measure(
    contenders: Sequence[Contender],
    input_sets: Sequence[Sequence[Any]],
    *,
    clock: Any,
    config: Config = Config(),
    expected: Sequence[Any] | None = None,
    compare: Compare | None = None,
) -> Measurement:
    """Time `contenders` on `input_sets` with `clock`, interleaved run by run.

    Each contender gets its own clones of the input sets (slots). Warm-up: each contender in
    turn is called until it has run `min_warmup_runs` times and for `warmup` seconds. Then
    rounds: every contender once, in `round_order`, all on the same slot (round r uses slot
    r mod the number of sets), until every median's relative standard error is at most
    `target_rse` (after `min_runs` runs each; checked every round up to 50 rounds, then
    whenever the count grew by 5%) or `max_time` seconds of rounds have passed.

    With `expected` (the reference output of each input set), the outputs of the first run
    of each slot and of a random `check_fraction` of the others are compared with `compare`;
    before such a run the slot is refilled, in place, with the values of another input set,
    so a contender that replays the output of an earlier call on the same tensors fails.
    A contender that raises, mismatches, or whose work escapes the measured stream is marked
    failed (`failure`) and leaves the remaining rounds."""
    if not contenders:
        raise ValueError("measure() needs at least one contender")
    if not input_sets:
        raise ValueError("measure() needs at least one input set")
    keys = [c.key for c in contenders]
    if len(set(keys)) != len(keys):
        raise ValueError(f"contender keys must be distinct: {keys}")
    by_key = {c.key: c for c in contenders}
    results = {c.key: ContenderResult(c.key, c.label) for c in contenders}
    compare = compare or default_compare
    n_sets = len(input_sets)
    rng = random.Random(config.seed)
    clock.prepare()

    slots = {c.key: [clone_inputs(s) for s in input_sets] for c in contenders}
    content = {c.key: list(range(n_sets)) for c in contenders}  # which input set each slot holds
    runners: dict[str, list[Callable[[], Any]]] = {}

    def failed(key: str) -> bool:
        return results[key].failure is not None

    def run_once(key: str, slot: int) -> Sample | None:
        contender = by_key[key]
        try:
            with contender.context():
                return clock.time(key, runners[key][slot])
        except TimingError as exc:
            results[key].fail(str(exc))
        except Exception as exc:  # the contender's own error ends its timing, not the run
            results[key].fail(f"raised {type(exc).__name__}: {exc}")
            results[key].error = exc
        return None

    for contender in contenders:
        key = contender.key
        # Warm-up calls the contender directly; a CUDA graph is captured only afterwards,
        # once lazy initialisation and autotuning are done.
        runners[key] = [(lambda fn=contender.fn, args=args: fn(*args)) for args in slots[key]]
        start = clock.now()
        runs = 0
        while runs < config.min_warmup_runs or clock.now() - start < config.warmup:
            if run_once(key, runs % n_sets) is None:
                break
            runs += 1
        results[key].warmup_runs = runs
        results[key].warmup_seconds = clock.now() - start
        if failed(key):
            continue
        try:
            runners[key] = [clock.runner(contender, args) for args in slots[key]]
        except Exception as exc:
            results[key].fail(f"could not be prepared for timing ({type(exc).__name__}: {exc})")
            continue
        if getattr(clock, "graphs", False):
            for slot in range(n_sets):  # each captured graph replays once before it is timed
                if run_once(key, slot) is None:
                    break

    schedule: list[tuple[int, str, int]] = []
    began = clock.now()
    next_check = config.min_runs
    stop_reason = "max_rounds"
    rounds = 0
    while rounds < config.max_rounds:
        alive = [k for k in keys if not failed(k)]
        if not alive:
            stop_reason = "all failed"
            break
        slot = rounds % n_sets
        checked_round = expected is not None and (rounds < n_sets or rng.random() < config.check_fraction)
        for key in round_order(keys, rounds):
            if failed(key):
                continue
            check = checked_round and by_key[key].check
            if check and n_sets > 1:
                source = (content[key][slot] + 1) % n_sets
                refill_inputs(slots[key][slot], input_sets[source])
                content[key][slot] = source
            schedule.append((rounds, key, slot))
            sample = run_once(key, slot)
            if sample is None:
                continue
            result = results[key]
            result.samples.append(sample.seconds)
            result.walls.append(sample.wall)
            result.escapes.append(sample.escaped)
            if check:
                result.checked += 1
                problem = compare(sample.output, expected[content[key][slot]])
                if problem:
                    result.fail(f"output of timed run {len(result.samples)} (input set "
                                f"{content[key][slot]}) differs from the reference: {problem}")
            del sample
        rounds += 1
        live = [results[k] for k in keys if not failed(k)]
        if rounds >= next_check or rounds <= 50:
            if live and precise_enough([r.samples for r in live], config):
                stop_reason = "target_rse"
                break
            next_check = max(rounds + 1, math.ceil(rounds * 1.05))
        if clock.now() - began >= config.max_time:
            stop_reason = "max_time"
            break

    for key in keys:
        _check_escape(results[key], clock.escape_floor, config)
    return Measurement(results=results, schedule=schedule, rounds=rounds, stop_reason=stop_reason,
                       seconds=clock.now() - began, clock=clock.name,
                       flush_bytes=getattr(clock, "flush_bytes", 0),
                       escape_floor=clock.escape_floor, config=config)


def escape_limit(median_seconds: float, floor: float, config: Config) -> float:
    """Largest tolerated median escape time: the calibrated floor + escape_abs +
    escape_rel x the contender's median."""
    return floor + config.escape_abs + config.escape_rel * median_seconds


def _check_escape(result: ContenderResult, floor: float, config: Config) -> None:
    if result.failure is not None or len(result.escapes) < 3:
        return
    escaped = median(result.escapes)
    mid = median(result.samples)
    if escaped > escape_limit(mid, floor, config):
        result.fail(
            f"work escaped the measured stream: the device stayed busy {format_seconds(escaped)} "
            f"(median of {len(result.escapes)} runs) after the current stream's end event, against "
            f"{format_seconds(mid)} measured on that stream; launch every kernel on "
            "torch.cuda.current_stream() (a side stream or deferred work is not timed)")


def format_seconds(seconds: float | None) -> str:
    """3 significant digits with a unit: 12.3 us, 4.56 ms, 1.20 s."""
    if seconds is None or (isinstance(seconds, float) and (math.isnan(seconds) or math.isinf(seconds))):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale or unit == "ns":
            value = seconds / scale
            digits = 2 if value < 10 else 1 if value < 100 else 0
            return f"{value:.{digits}f} {unit}"
    return f"{seconds:.3g} s"
