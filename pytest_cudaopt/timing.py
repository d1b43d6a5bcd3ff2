"""The timing engine: every contender timed alike by two clocks (device time, latency), interleaved, until the medians are tight."""

from __future__ import annotations

import copy
import math
import random
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import torch

from pytest_cudaopt.clocks import (  # noqa: F401  (the clocks are part of the engine's interface)
    Clock, CudaClock, FakeClock, GpuLead, PerfCounterClock, Run, Sample, TimingError, default_clock,
    host_time, synchronize_device, tampered,
)
from pytest_cudaopt.stats import Summary, median, relative_standard_error

CLOCKS = ("device", "latency")  # what the gate can compare: see Config.clock

# ---------------------------------------------------------------------------------------
# Contenders and settings


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
    clock: str = "device"          # the figure the stop rule and the gate use: "device" or "latency"
    share_inputs: bool = False     # one copy of each input set for all contenders (memory-bound problems)

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"unknown clock {self.clock!r}; expected one of {', '.join(CLOCKS)}")

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> "Config":
        values = dict(warmup=settings.warmup, max_time=settings.max_time,
                      target_rse=settings.target_rse, min_runs=settings.min_runs)
        if getattr(settings, "clock", None):
            values["clock"] = settings.clock
        values.update(overrides)
        return cls(**values)


# ---------------------------------------------------------------------------------------
# The engine


@dataclass
class ContenderResult:
    """One contender's runs: `device` and `latency` per timed round, `samples` the ones of
    the clock that gates (Config.clock), `walls`/`escapes` of the latency runs."""

    key: str
    label: str
    samples: list[float] = field(default_factory=list)
    device: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
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
    def device_summary(self) -> Summary:
        return Summary.of(self.device)

    @property
    def latency_summary(self) -> Summary:
        return Summary.of(self.latency)

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
                "min_s": _num(s.minimum),
                "device_median_s": _num(self.device_summary.median),
                "device_iqr_s": _num(self.device_summary.iqr),
                "latency_median_s": _num(self.latency_summary.median),
                "latency_iqr_s": _num(self.latency_summary.iqr),
                "wall_median_s": _num(self.wall_median),
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
    queued_rounds: int = 0     # rounds timed with the host ahead of the GPU (device time) ...
    behind_rounds: int = 0     # ... and among them, rounds where the host needed longer than the lead

    @property
    def gate_clock(self) -> str:
        return self.config.clock

    def __getitem__(self, key: str) -> ContenderResult:
        return self.results[key]

    def to_json(self) -> dict[str, Any]:
        return {"clock": self.clock, "gate_clock": self.gate_clock, "queued_rounds": self.queued_rounds,
                "behind_rounds": self.behind_rounds, "rounds": self.rounds, "stop_reason": self.stop_reason,
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
    """A deep copy of the inputs: every tensor cloned (same strides), other values copied
    (a candidate that mutates a list argument cannot reach the reference's)."""
    return [x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]


def refill_inputs(target: Sequence[Any], source: Sequence[Any]) -> None:
    """Copy the values of one input set into another's tensors, in place (same storage)."""
    for dst, src in zip(target, source):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)


def _default_compare(output: Any, expected: Any) -> str | None:
    """The correctness verdict's comparison at its default tolerances: None when they match."""
    from pytest_cudaopt.compare import compare_outputs

    result = compare_outputs(output, expected)
    return None if result.passed else result.table()


def measure(
    contenders: Sequence[Contender],
    input_sets: Sequence[Sequence[Any]],
    *,
    clock: Clock,
    config: Config = Config(),
    expected: Sequence[Any] | None = None,
    compare: Compare | None = None,
) -> Measurement:
    """Time `contenders` on `input_sets` with `clock`, interleaved run by run.

    Each contender gets its own clones of the input sets (slots). Warm-up: each contender in
    turn is called until it has run `min_warmup_runs` times and for `warmup` seconds. Then
    one untimed queued pass of every contender (the clock learns the host's enqueue time).
    Then rounds, all contenders on the same slot (round r uses slot r mod the number of
    sets), in `round_order`: first queued back to back with the host ahead of the GPU
    (`clock.queue`: device time), then each from an idle device (`clock.time`: latency).
    The clock named by `config.clock` gives `samples`, which the stop rule and the gate use:
    until every such median's relative standard error is at most `target_rse` (after
    `min_runs` runs each; checked every round up to 50 rounds, then whenever the count grew
    by 5%) or `max_time` seconds of rounds have passed.

    With `expected` (the reference output of each input set), the outputs of the first run
    of each slot and of a random `check_fraction` of the others are compared with `compare`;
    before such a run the slot is refilled, in place, with the values of another input set,
    so a contender that replays the output of an earlier call on the same tensors fails.
    Both runs of a checked round are compared (the queued one after the round's synchronise).
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
    compare = compare or _default_compare
    n_sets = len(input_sets)
    rng = random.Random(config.seed)
    clock.prepare()

    if config.share_inputs:  # one copy for all: a refill is seen by every contender, as is `content`
        shared, held = [clone_inputs(s) for s in input_sets], list(range(n_sets))
        slots = {c.key: shared for c in contenders}
        content = {c.key: held for c in contenders}
    else:
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
        except Exception as exc:
            record_error(key, exc)
        return None

    def record_error(key: str, exc: BaseException) -> None:
        if isinstance(exc, TimingError):
            results[key].fail(str(exc))
        else:  # the contender's own error ends its timing, not the run
            results[key].fail(f"raised {type(exc).__name__}: {exc}")
            results[key].error = exc

    def queue(order: Sequence[str], slot: int, keep: Sequence[str] = ()) -> list[Any]:
        """One queued pass; outputs are kept only for `keep` (the others are dropped at once,
        so a round holds one output at a time, as the latency runs do)."""
        def dropping(run: Callable[[], Any]) -> Callable[[], Any]:
            return lambda: (run(), None)[1]

        return clock.queue([(key, runners[key][slot] if key in keep else dropping(runners[key][slot]),
                             by_key[key].context) for key in order])

    def check_output(key: str, slot: int, output: Any, which: str) -> None:
        result = results[key]
        result.checked += 1
        problem = compare(output, expected[content[key][slot]])
        if problem:
            result.fail(f"output of timed round {rounds + 1} ({which}, input set "
                        f"{content[key][slot]}) differs from the reference: {problem}")

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
            runners[key] = [clock.runner(contender.fn, contender.context, args) for args in slots[key]]
        except Exception as exc:
            results[key].fail(f"could not be prepared for timing ({type(exc).__name__}: {exc})")
            continue
        if getattr(clock, "graphs", False):
            for slot in range(n_sets):  # each captured graph replays once before it is timed
                if run_once(key, slot) is None:
                    break
    alive = [k for k in keys if not failed(k)]
    for key, outcome in zip(alive, queue(alive, 0) if alive else []):
        if isinstance(outcome, BaseException):
            record_error(key, outcome)
    queued_before = getattr(clock, "queued_rounds", 0)
    behind_before = getattr(clock, "behind_rounds", 0)

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
        order = [k for k in round_order(keys, rounds) if not failed(k)]
        checks = {key: checked_round and by_key[key].check for key in order}
        refilled = False
        for key in order:
            # Shared inputs are refilled once a round: every contender last ran on this slot's
            # previous values, so one change reaches them all (several would cycle back).
            if checks[key] and n_sets > 1 and not (config.share_inputs and refilled):
                source = (content[key][slot] + 1) % n_sets
                refill_inputs(slots[key][slot], input_sets[source])
                content[key][slot] = source
                refilled = True
            schedule.append((rounds, key, slot))
        kept = [k for k in order if checks[k]]
        if config.share_inputs and kept:
            # Memory-bound problems: a queued round keeps one output (each contender's in turn),
            # not one per contender; every checked contender's latency run is still checked.
            kept = [kept[rounds % len(kept)]]
        device: dict[str, float] = {}
        for key, outcome in zip(order, queue(order, slot, keep=kept)):
            if isinstance(outcome, BaseException):
                record_error(key, outcome)
                continue
            device[key] = outcome.seconds
            if key in kept:  # the queued outputs are checked (and freed) before the latency runs
                check_output(key, slot, outcome.output, "queued")
            del outcome
        for key in order:
            if failed(key) or key not in device:
                continue
            sample = run_once(key, slot)
            if sample is None:
                continue
            result = results[key]
            result.device.append(device[key])
            result.latency.append(sample.seconds)
            result.samples.append(device[key] if config.clock == "device" else sample.seconds)
            result.walls.append(sample.wall)
            result.escapes.append(sample.escaped)
            if checks[key]:
                check_output(key, slot, sample.output, "from an idle device")
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
                       escape_floor=clock.escape_floor, config=config,
                       queued_rounds=getattr(clock, "queued_rounds", 0) - queued_before,
                       behind_rounds=getattr(clock, "behind_rounds", 0) - behind_before)


def escape_limit(median_seconds: float, floor: float, config: Config) -> float:
    """Largest tolerated median escape time: the calibrated floor + escape_abs +
    escape_rel x the contender's median."""
    return floor + config.escape_abs + config.escape_rel * median_seconds


def _check_escape(result: ContenderResult, floor: float, config: Config) -> None:
    if result.failure is not None or len(result.escapes) < 3:
        return
    escaped = median(result.escapes)
    mid = median(result.latency or result.samples)  # the escapes come from the latency runs
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
