"""The timing engine: every contender timed alike by two clocks (device time, latency), interleaved, each call on inputs no earlier call saw, until the medians are tight."""

from __future__ import annotations

import math
import random
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

from pytest_cudaopt.perf.clocks import Clock, TimingError
from pytest_cudaopt.perf.runs import CandidateCall, Run, Sample
from pytest_cudaopt.perf.feed import Call, Feed
from pytest_cudaopt.perf.measurement import ContenderResult, Measurement
from pytest_cudaopt.perf.stats import format_seconds, median, relative_standard_error
from pytest_cudaopt.primitives.tensors import refill_inputs
from pytest_cudaopt.remote.candidate import Candidate

CLOCKS = ("device", "latency")  # what the gate can compare: see Config.clock


@dataclass
class Contender:
    """One thing to time: a stable `key`, the tables' `label`, a `scope` entered around every call (e.g. TF32)."""

    key: str
    fn: Callable[..., Any]
    label: str = ""
    scope: Callable[[], ContextManager] | None = None
    check: bool = True
    every_call: bool = False   # checked on every timed call: the candidate may replay an earlier output
    # ModelNew (this workdir's or the target branch's): its calls are timed by it, in batches.
    candidate: Candidate | None = None

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
    min_runs: int = 50             # timed runs per contender before the stop rule may fire ...
    min_rounds: int = 5            # ... and rounds (each gives every contender one latency run: the escape check)
    min_warmup_runs: int = 3
    max_rounds: int = 100_000
    check_fraction: float = 0.05   # share of timed rounds (after the first `checked_rounds`) whose outputs are checked
    checked_rounds: int = 4        # the first rounds: every output checked
    escape_abs: float = 5e-6       # seconds of device work after the stream's end event that are tolerated ...
    escape_rel: float = 0.05       # ... plus this share of the contender's median
    seed: int = 0                  # which runs are checked
    clock: str = "device"          # the figure the stop rule and the gate use: "device" or "latency"
    queue_group: int = 0           # contenders per queued pass (0: all; fewer when their inputs do not fit)
    one_check_per_pass: bool = False  # a checked queued pass keeps one output, not one per contender (memory)
    batch_window: float = 2e-3     # a pass gives each contender a batch of calls this long (the fastest's) ...
    max_batch: int = 32            # ... of at most this many (the memory plan's; the clock may cap it)
    # (custom, baseline): the gate's pair. The custom fails untimed when even its fastest call of the second half
    # of its warm-up took more than `far_slower` x the baseline's slowest there: its gate cannot pass.
    gate: tuple[str, str] | None = None
    far_slower: float = 10.0

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"unknown clock {self.clock!r}; expected one of {', '.join(CLOCKS)}")

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> "Config":
        values = dict(warmup=settings.warmup, max_time=settings.max_time,
                      target_rse=settings.target_rse, min_runs=settings.min_runs)
        if getattr(settings, "far_slower", None) is not None:
            values["far_slower"] = settings.far_slower
        if getattr(settings, "clock", None):
            values["clock"] = settings.clock
        values.update(overrides)
        return cls(**values)


Compare = Callable[[Any, Any, str], "str | None"]  # (output, expected, contender key) -> None, or the failure table


def precise_enough(samples: Sequence[Sequence[float]], config: Config) -> bool:
    """The stop rule: every contender has `min_runs` samples and a median's relative standard error <= `target_rse`."""
    return all(len(values) >= config.min_runs
               and relative_standard_error(values) <= config.target_rse for values in samples)


def round_order(keys: Sequence[str], round_index: int) -> list[str]:
    """Contenders of one round, rotated by the round number: each runs first, and after each other, equally often."""
    k = round_index % len(keys)
    return list(keys[k:]) + list(keys[:k])


class Engine:
    """One timing run (see `measure`): the warm-up, the timed rounds and the stop rule; the runs in `results`."""

    def __init__(self, contenders: Sequence[Contender], feed: Feed, *, clock: Clock, config: Config,
                 compare: Compare | None = None):
        if not contenders:
            raise ValueError("measure() needs at least one contender")
        self.keys = [c.key for c in contenders]
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"contender keys must be distinct: {self.keys}")
        if feed.reference is not None and compare is None:
            raise ValueError("measure() with a reference to check outputs against needs `compare`")
        self.by_key = {c.key: c for c in contenders}
        self.results = {c.key: ContenderResult(c.key, c.label) for c in contenders}
        self.feed, self.clock, self.config, self.compare = feed, clock, config, compare
        self.feed_before = (feed.drawn, feed.seconds)  # what the feed gave before this run
        self.rng = random.Random(config.seed)
        self.schedule: list[tuple[int, str, int]] = []
        self.rounds = 0
        # A CUDA graph replays on its captured addresses: every call's inputs are copied into one slot.
        self.fixed = clock.graphs
        self.slots: dict[str, list] = {}
        self.runners: dict[str, Callable[[], Any]] = {}
        self.batch = 1                           # chosen after the warm-up (choose_batch) ...
        self.warm: dict[str, list[float]] = {}   # ... from each contender's warm-up figures

    def failed(self, key: str) -> bool:
        return self.results[key].failure is not None

    def alive(self) -> list[str]:
        return [k for k in self.keys if not self.failed(k)]

    def record_error(self, key: str, exc: BaseException) -> None:
        if isinstance(exc, TimingError):
            self.results[key].fail(str(exc))
        else:  # the contender's own error ends its timing, not the run
            self.results[key].fail(f"raised {type(exc).__name__}: {exc}")
            self.results[key].error = exc

    def call(self, key: str, check: bool = False) -> Call:
        """A call of `key` on a fresh input set (with `check`, its expected output), prepared outside the timing."""
        index, inputs = self.feed.next()
        expected = self.feed.expected(inputs) if check else None
        contender = self.by_key[key]
        if contender.candidate is not None:
            call = CandidateCall(contender.candidate, inputs)
            return Call(key, index, call, check, expected, candidate=call)
        if key in self.runners:  # a captured graph: the fresh values go into its slot
            refill_inputs(self.slots[key], inputs)
            run = self.runners[key]
        elif self.fixed:  # warm-up, before the graph is captured: a plain call
            run = lambda fn=contender.fn, args=inputs: fn(*args)  # noqa: E731
        else:
            run = self.clock.runner(contender.fn, contender.context, inputs)
        return Call(key, index, run, check, expected)

    def run_once(self, call: Call) -> Sample | None:
        """One call from an idle device (the latency clock), or None when it raised."""
        try:
            with self.by_key[call.key].context():
                return self.clock.time(call.key, call.run, call.candidate)
        except Exception as exc:
            self.record_error(call.key, exc)
        return None

    def queue(self, calls: Sequence[Call]) -> list[Any]:
        """One queued pass (device time). Every output is kept until the pass is done (one written into the
        block just freed would find it in L2); under `one_check_per_pass` only the checked ones."""
        def run(call: Call) -> Run:
            scope = self.by_key[call.key].context
            if call.checked or not self.config.one_check_per_pass:
                return Run(call.key, call.run, scope, call.candidate)
            if call.candidate is not None:
                return Run(call.key, call.candidate.dropped(), scope, call.candidate.dropped())
            return Run(call.key, lambda: (call.run(), None)[1], scope)

        return self.clock.queue([run(c) for c in calls])

    def check_output(self, call: Call, output: Any, which: str) -> None:
        result = self.results[call.key]
        result.checked += 1
        problem = self.compare(output, call.expected, call.key)
        if problem:
            result.fail(f"output of timed round {self.rounds + 1} ({which}, input set {call.index}) "
                        f"differs from the reference: {problem}")

    def warm_up(self) -> None:
        """Each contender called `min_warmup_runs` times and for `warmup` seconds, its CUDA graph captured
        after that; then one untimed queued pass (the clock learns the host's enqueue time)."""
        for key in self.keys:
            start, runs = self.clock.now(), 0
            while runs < self.config.min_warmup_runs or self.clock.now() - start < self.config.warmup:
                sample = self.run_once(self.call(key))
                if sample is None:
                    break
                self.warm.setdefault(key, []).append(sample.seconds)
                runs += 1
                del sample   # its output too, before the next call makes one
            self.results[key].warmup_runs = runs
            self.results[key].warmup_seconds = self.clock.now() - start
            self._far_slower(key)
            if self.fixed and not self.failed(key) and self.by_key[key].candidate is None:
                self._capture(key)   # the candidate's calls are timed by it, never captured here
        self.batch = self.choose_batch()
        alive = self.alive()
        calls = [self.call(k) for k in alive for _ in range(self.batch)]
        for call, outcome in zip(calls, self.queue(calls) if calls else []):
            if isinstance(outcome, BaseException):
                self.record_error(call.key, outcome)

    def _far_slower(self, key: str) -> None:
        """The gate's custom contender, warmed up after its baseline, far slower than it in every call of the second
        half of both warm-ups (the first calls may pay one-time costs): failed, and neither timed nor traced."""
        if self.config.gate is None or not self.config.far_slower or key != self.config.gate[0] or self.failed(key):
            return
        baseline = self.config.gate[1]
        mine, theirs = self.warm.get(key, []), self.warm.get(baseline, [])
        if not mine or not theirs or self.failed(baseline):
            return
        fastest, slowest = min(mine[len(mine) // 2:]), max(theirs[len(theirs) // 2:])
        if fastest > self.config.far_slower * slowest:
            result = self.results[key]
            result.fail(f"far slower than {self.results[baseline].label}: the fastest of its last "
                        f"{len(mine) - len(mine) // 2} warm-up calls took {format_seconds(fastest)}, more than "
                        f"{self.config.far_slower:g}x the slowest of the baseline's ({format_seconds(slowest)}); "
                        f"not timed further")
            result.untimed = True

    def choose_batch(self) -> int:
        """Calls per contender in a queued pass: the fastest's batch lasts `batch_window`; one for CUDA graphs."""
        if self.fixed:
            return 1
        per_call = [median(self.warm[k][len(self.warm[k]) // 2:]) for k in self.alive() if self.warm.get(k)]
        cap = min(self.config.max_batch, self.clock.max_batch or self.config.max_batch)
        return max(1, min(cap, math.ceil(self.config.batch_window / max(min(per_call), 1e-9)))) if per_call else 1

    def _capture(self, key: str) -> None:
        contender = self.by_key[key]
        _, self.slots[key] = self.feed.next()
        try:
            self.runners[key] = self.clock.runner(contender.fn, contender.context, self.slots[key])
        except Exception as exc:
            self.results[key].fail(f"could not be prepared for timing ({type(exc).__name__}: {exc})")
            return
        self.run_once(self.call(key))  # the captured graph replays once before it is timed

    def round(self) -> None:
        """Every live contender: `batch` queued calls each (device time), then one from an idle device (latency)."""
        checked_round = self.feed.reference is not None and (
            self.rounds < self.config.checked_rounds or self.rng.random() < self.config.check_fraction)
        order = [k for k in round_order(self.keys, self.rounds) if not self.failed(k)]
        checks = {key: self.feed.reference is not None and self.by_key[key].check
                  and (checked_round or self.by_key[key].every_call) for key in order}
        device: dict[str, list[float]] = {}
        size = self.config.queue_group or len(order)
        for group in [order[i:i + size] for i in range(0, len(order), size)]:
            kept = [k for k in group if checks[k]]
            if self.config.one_check_per_pass and kept:
                # Memory-bound problems: a queued pass keeps one output (the candidate's, else each in turn).
                every = [k for k in kept if self.by_key[k].every_call]
                kept = every[:1] or [kept[self.rounds % len(kept)]]
            calls = [self.call(key, key in kept and (i == 0 or self.by_key[key].every_call))
                     for key in group for i in range(self.batch)]
            for call, outcome in zip(calls, self.queue(calls)):
                self.schedule.append((self.rounds, call.key, call.index))
                if self.failed(call.key):
                    continue
                if isinstance(outcome, BaseException):
                    self.record_error(call.key, outcome)
                    continue
                device.setdefault(call.key, []).append(outcome.seconds)
                if call.checked:  # the queued outputs are checked (and freed) before the latency runs
                    self.check_output(call, outcome.output, "queued")
                del outcome
            del calls
        for key in order:
            if not self.failed(key) and key in device:
                self._latency_run(self.call(key, checks[key]), device[key])
        self.rounds += 1

    def _latency_run(self, call: Call, device_seconds: list[float]) -> None:
        self.schedule.append((self.rounds, call.key, call.index))
        sample = self.run_once(call)
        if sample is None:
            return
        result = self.results[call.key]
        result.device.extend(device_seconds)
        result.latency.append(sample.seconds)
        result.samples.extend(device_seconds if self.config.clock == "device" else [sample.seconds])
        result.walls.append(sample.wall)
        result.escapes.append(sample.escaped)
        if call.checked:
            self.check_output(call, sample.output, "from an idle device")

    def run(self) -> Measurement:
        """Warm up, then rounds until the stop rule (each round to 50, then each 5% more), `max_time`, `max_rounds`."""
        self.clock.prepare()
        self.warm_up()
        queued_before, behind_before = self.clock.queued_rounds, self.clock.behind_rounds
        began = self.clock.now()
        next_check = self.config.min_runs
        stop_reason = "max_rounds"
        while self.rounds < self.config.max_rounds:
            if not self.alive():
                stop_reason = "all failed"
                break
            self.round()
            live = [self.results[k] for k in self.alive()]
            if self.rounds >= next_check or self.rounds <= 50:
                if live and self.rounds >= self.config.min_rounds and precise_enough([r.samples for r in live],
                                                                                      self.config):
                    stop_reason = "target_rse"
                    break
                next_check = max(self.rounds + 1, math.ceil(self.rounds * 1.05))
            if self.clock.now() - began >= self.config.max_time:
                stop_reason = "max_time"
                break
        for result in self.results.values():
            _check_escape(result, self.clock.escape_floor, self.config)
        return Measurement(results=self.results, schedule=self.schedule, rounds=self.rounds,
                           stop_reason=stop_reason, seconds=self.clock.now() - began, clock=self.clock.name,
                           flush_bytes=self.clock.flush_bytes,
                           escape_floor=self.clock.escape_floor, config=self.config,
                           queued_rounds=self.clock.queued_rounds - queued_before,
                           behind_rounds=self.clock.behind_rounds - behind_before,
                           inputs_drawn=self.feed.drawn - self.feed_before[0],
                           draw_seconds=self.feed.seconds - self.feed_before[1], batch=self.batch)


def measure(contenders: Sequence[Contender], feed: Feed, *, clock: Clock, config: Config = Config(),
            compare: Compare | None = None) -> Measurement:
    """Time `contenders` with `clock`, interleaved run by run (`Engine`), every call on an input set of its own."""
    return Engine(contenders, feed, clock=clock, config=config, compare=compare).run()


def escape_limit(median_seconds: float, floor: float, config: Config) -> float:
    """Largest tolerated median escape time: floor + escape_abs + escape_rel x the contender's median."""
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
