"""The timing engine on CPU contenders: order, warm-up, stop rule, fresh inputs for every call, output checks, escapes, tampering."""

from collections import Counter

import pytest
import torch

from pytest_cudaopt.primitives import tensors
from pytest_cudaopt.correctness.compare import compare_outputs
from pytest_cudaopt.perf import clocks, engine
from pytest_cudaopt.perf.clocks import PerfCounterClock
from pytest_cudaopt.perf.engine import Config, Contender, measure
from pytest_cudaopt.perf.feed import Feed
from doubles import FakeClock

MS = 1e-3


def doubler(x):
    return x * 2


def feed(size=8, checked=True, reference=doubler):
    """Input set n: one tensor drawn from a generator seeded with n; the reference doubles it."""
    def draw(n):
        return [torch.randn(size, generator=torch.Generator().manual_seed(n))]

    return Feed(draw, reference if checked else None)


def table(output, expected, key=None):
    """The perf item's output check: the correctness comparison at its default tolerances."""
    result = compare_outputs(output, expected)
    return None if result.passed else result.table()


def quick(**overrides):
    """A short run, one call per contender a pass unless `max_batch` says otherwise."""
    values = dict(warmup=0.0, min_warmup_runs=1, max_time=10.0, target_rse=0.01, min_runs=10, max_batch=1)
    values.update(overrides)
    return Config(**values)


def test_contenders_are_interleaved_with_a_rotating_start_each_call_on_a_fresh_input_set():
    contenders = [Contender(k, doubler) for k in "abc"]
    m = measure(contenders, feed(), clock=FakeClock({}, default=MS), config=quick(), compare=table)
    # Each round: the queued pass, then the idle-device runs, in the same order.
    assert [(r, key) for r, key, _ in m.schedule[:18]] == [
        (0, "a"), (0, "b"), (0, "c")] * 2 + [(1, "b"), (1, "c"), (1, "a")] * 2 + [(2, "c"), (2, "a"), (2, "b")] * 2
    firsts = Counter(key for (r, key, _), i in zip(m.schedule, range(len(m.schedule))) if i % 6 == 0)
    assert set(firsts) == {"a", "b", "c"}
    assert max(firsts.values()) - min(firsts.values()) <= 1
    indices = [index for _, _, index in m.schedule]
    assert len(set(indices)) == len(indices) == 6 * m.rounds   # no input set twice
    assert m.inputs_drawn > len(indices)  # the warm-up drew its own too


def test_round_order_rotates_by_the_round_number():
    assert engine.round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert engine.round_order(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert engine.round_order(["a", "b", "c"], 5) == ["c", "a", "b"]


def test_identical_runs_stop_at_min_runs_by_the_error_target():
    m = measure([Contender("a", doubler), Contender("b", doubler)], feed(checked=False),
                clock=FakeClock({"a": MS, "b": 2 * MS}), config=quick(min_runs=12))
    assert m.stop_reason == "target_rse"
    assert m.rounds == 12
    assert m["a"].summary.median == pytest.approx(MS)
    assert m["b"].summary.median == pytest.approx(2 * MS)
    assert m["a"].summary.iqr == 0.0


def test_noisy_runs_stop_at_the_time_cap():
    # 1, 2, 3, 4 ms over and over: the error never reaches 1e-9.
    clock = FakeClock({"a": [MS, 2 * MS, 3 * MS, 4 * MS]})
    m = measure([Contender("a", doubler)], feed(checked=False), clock=clock, config=quick(max_time=0.5, target_rse=1e-9))
    assert m.stop_reason == "max_time"
    assert 0.5 <= m.seconds < 0.5 + 2 * 4 * MS  # the round that crosses the cap completes (two runs each)
    assert m["a"].summary.median == pytest.approx(2.5 * MS)
    assert m["a"].summary.iqr == pytest.approx(1.5 * MS, rel=0.05)


def test_warm_up_runs_for_its_time_and_at_least_min_warmup_runs():
    clock = FakeClock({"fast": 1 / 64, "slow": 0.25})  # binary fractions: exact virtual time
    m = measure([Contender("fast", doubler), Contender("slow", doubler)], feed(checked=False), clock=clock,
                config=quick(warmup=0.5, min_warmup_runs=3, min_runs=2))
    assert m["fast"].warmup_runs == 32     # 32 x 1/64 s = 0.5 s
    assert m["slow"].warmup_runs == 3      # 2 x 0.25 s would do, 3 is the minimum
    assert clock.calls[:35] == ["fast"] * 32 + ["slow"] * 3
    assert m["fast"].summary.n == m.rounds  # warm-up runs are not samples


def _gated(**overrides):
    return quick(gate=("custom", "compile"), warmup=0.1, min_warmup_runs=4, min_runs=5, **overrides)


def test_a_custom_far_slower_than_the_gates_baseline_in_its_warm_up_fails_untimed_and_the_others_are_timed():
    clock = FakeClock({"eager": 2 * MS, "compile": MS, "custom": 11 * MS})
    contenders = [Contender("eager", doubler), Contender("compile", doubler), Contender("custom", doubler)]
    m = measure(contenders, feed(checked=False), clock=clock, config=_gated())
    custom = m["custom"]
    assert custom.untimed and custom.failure.startswith("far slower than compile") and "10x" in custom.failure
    assert custom.samples == [] and clock.calls.count("custom") == custom.warmup_runs == 10   # 0.1 s of 11 ms
    assert m["compile"].summary.n >= 5 and m["eager"].summary.n >= 5   # the table keeps its other figures


def test_a_custom_within_the_factor_or_without_a_gate_is_timed_and_judged_on_its_medians():
    for durations, config in (({"compile": MS, "custom": 9 * MS}, _gated()),
                              ({"compile": MS, "custom": 50 * MS}, quick(warmup=0.1, min_warmup_runs=4, min_runs=5))):
        contenders = [Contender("compile", doubler), Contender("custom", doubler)]
        m = measure(contenders, feed(checked=False), clock=FakeClock(durations), config=config)
        assert m["custom"].failure is None and not m["custom"].untimed and m["custom"].summary.n >= 5


def test_far_slower_comes_from_the_settings_and_zero_times_every_custom_in_full():
    from types import SimpleNamespace

    settings = SimpleNamespace(warmup=0.1, max_time=10.0, target_rse=0.01, min_runs=5, far_slower=0.0)
    config = Config.from_settings(settings, gate=("custom", "compile"), min_warmup_runs=4, max_batch=1)
    assert config.far_slower == 0.0
    contenders = [Contender("compile", doubler), Contender("custom", doubler)]
    m = measure(contenders, feed(checked=False), clock=FakeClock({"compile": MS, "custom": 50 * MS}), config=config)
    assert m["custom"].failure is None and m["custom"].summary.n >= 5


def test_a_custom_slow_only_in_its_first_warm_up_calls_is_timed():
    """One-time costs (lazy loading, an allocator growing, a tuner's first tries) fall in the first half."""
    calls = iter(range(1_000_000))

    def custom_seconds():
        return 40 * MS if next(calls) < 3 else 0.5 * MS

    contenders = [Contender("compile", doubler), Contender("custom", doubler)]
    clock = FakeClock({"compile": MS, "custom": custom_seconds})
    m = measure(contenders, feed(checked=False), clock=clock, config=_gated())
    assert m["custom"].failure is None and m["custom"].summary.median == pytest.approx(0.5 * MS)


def test_a_baseline_that_failed_its_warm_up_ends_no_custom_early():
    def broken(x):
        raise RuntimeError("no compiler")

    contenders = [Contender("compile", broken), Contender("custom", doubler)]
    m = measure(contenders, feed(checked=False), clock=FakeClock({"custom": 50 * MS}, default=MS), config=_gated())
    assert m["compile"].failure and m["custom"].failure is None and m["custom"].summary.n >= 5


def test_a_contender_that_writes_into_its_inputs_reaches_no_other_call():
    def vandal(x):
        out = x * 2
        x.fill_(1e6)  # corrupts only the inputs of this one call
        return out

    m = measure([Contender("vandal", vandal), Contender("honest", doubler)], feed(),
                clock=FakeClock({}, default=MS), config=quick(), compare=table)
    assert m["honest"].failure is None and m["vandal"].failure is None
    assert m["vandal"].checked >= 8


def test_a_reference_that_mutates_its_input_does_not_fail_the_contenders_checked_against_it():
    # KernelBench style `x.mul_(w).add_(b); return x`: the eager reference is itself a contender.
    def in_place(x):
        return x.mul_(2)

    m = measure([Contender("eager", in_place), Contender("custom", doubler)], feed(reference=in_place),
                clock=FakeClock({}, default=MS), config=quick(check_fraction=1.0), compare=table)
    assert m["eager"].failure is None and m["custom"].failure is None
    assert m["eager"].checked == m["custom"].checked == 2 * m.rounds


class ContentMemo:
    """Caches its output by the input's content: right outputs, and a hit is free."""

    def __init__(self):
        self.cache, self.hits, self.calls = {}, 0, 0

    def __call__(self, x):
        self.calls += 1
        key = tuple(x.tolist())
        if key in self.cache:
            self.hits += 1
        else:
            self.cache[key] = x * 2
        return self.cache[key].clone()


def test_no_call_sees_inputs_an_earlier_call_saw_so_a_content_memo_never_hits():
    memo = ContentMemo()
    m = measure([Contender("honest", doubler), Contender("memo", memo)], feed(),
                clock=FakeClock({}, default=MS), config=quick(min_warmup_runs=5), compare=table)
    assert m["memo"].failure is None and m.rounds >= 10
    assert memo.calls == m["memo"].warmup_runs + 1 + 2 * m.rounds   # warm-up, the untimed pass, two a round
    assert memo.hits == 0


class Stale:
    """Returns a copy of its first output on every later call (a replayed or cached output)."""

    def __init__(self):
        self.first = None

    def __call__(self, x):
        if self.first is None:
            self.first = x * 2
        return self.first.clone()


def test_a_contender_that_replays_an_earlier_output_fails_the_output_check():
    m = measure([Contender("honest", doubler), Contender("replay", Stale())], feed(),
                clock=FakeClock({}, default=MS), config=quick(), compare=table)
    assert m["honest"].failure is None
    assert m["honest"].checked >= 8
    assert "differs from the reference" in m["replay"].failure
    assert "input set" in m["replay"].failure


class GraphLike(FakeClock):
    """A clock whose runner binds the inputs it was prepared with, as a CUDA graph does."""

    graphs = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prepared = 0

    def runner(self, fn, scope, args):
        self.prepared += 1
        return super().runner(fn, scope, args)


def test_with_cuda_graphs_each_call_refills_the_captured_inputs_in_place_with_fresh_values():
    seen = {}

    def recording(x):
        seen.setdefault(x.data_ptr(), []).append(x.clone())
        return x * 2

    clock = GraphLike({}, default=MS)
    m = measure([Contender("a", recording)], feed(), clock=clock, config=quick(min_warmup_runs=2), compare=table)
    assert m["a"].failure is None and clock.prepared == 1   # captured once
    timed = seen[max(seen, key=lambda ptr: len(seen[ptr]))]  # the captured slot's calls
    assert len(timed) >= 2 * m.rounds
    assert len({tuple(x.tolist()) for x in timed}) == len(timed)   # never the same values twice


def test_passes_queue_at_most_queue_group_contenders_each():
    class Counting(FakeClock):
        passes: list = []

        def queue(self, runs):
            Counting.passes.append(len(runs))
            return super().queue(runs)

    m = measure([Contender(k, doubler) for k in "abc"], feed(), clock=Counting({}, default=MS),
                config=quick(queue_group=2), compare=table)
    assert all(m[k].failure is None and m[k].summary.n == m.rounds for k in "abc")
    assert Counting.passes[1:] == [2, 1] * m.rounds   # after the warm-up's untimed pass


def test_one_check_per_pass_keeps_one_queued_output_not_one_per_contender():
    # Memory-bound problems: a queued pass holding every contender's output would not fit.
    import weakref

    alive, most = [0], [0]

    def released():
        alive[0] -= 1

    def tracked(x):
        out = x * 2
        alive[0] += 1
        most[0] = max(most[0], alive[0])
        weakref.finalize(out, released)
        return out

    keys = ["a", "b", "c", "d"]
    m = measure([Contender(k, tracked) for k in keys], feed(), clock=FakeClock({}, default=MS),
                config=quick(one_check_per_pass=True, check_fraction=1.0), compare=table)
    assert all(m[k].failure is None and m[k].checked >= 3 for k in keys)
    assert most[0] <= 2    # the kept queued output and the call running now
    every = measure([Contender(k, tracked) for k in keys], feed(), clock=FakeClock({}, default=MS),
                    config=quick(check_fraction=1.0), compare=table)
    assert all(every[k].failure is None for k in keys)
    assert most[0] == len(keys)   # otherwise each contender's queued output is checked


def test_a_contender_that_changes_once_timing_starts_fails():
    calls = Counter()

    def lazy(x):
        calls["n"] += 1
        return x * 2 if calls["n"] <= 3 else torch.zeros_like(x)

    m = measure([Contender("lazy", lazy)], feed(), clock=FakeClock({}, default=MS),
                config=quick(min_warmup_runs=3), compare=table)
    assert "differs from the reference" in m["lazy"].failure
    assert m.stop_reason == "all failed"


def test_a_contender_that_raises_is_marked_failed_and_the_others_continue():
    calls = Counter()

    def flaky(x):
        calls["n"] += 1
        if calls["n"] == 6:
            raise ValueError("kernel launch failed")
        return x * 2

    m = measure([Contender("flaky", flaky), Contender("steady", doubler)], feed(checked=False),
                clock=FakeClock({}, default=MS), config=quick(min_warmup_runs=2, min_runs=10))
    assert m["flaky"].failure == "raised ValueError: kernel launch failed"
    assert isinstance(m["flaky"].error, ValueError)
    assert m["steady"].failure is None
    assert m["steady"].summary.n == 10


def test_work_that_escapes_the_measured_stream_fails_with_that_reason():
    clock = FakeClock({"honest": 100e-6, "side-stream": 20e-6},
                      escaped={"honest": 3e-6, "side-stream": 500e-6}, escape_floor=2e-6)
    m = measure([Contender("honest", doubler), Contender("side-stream", doubler)], feed(checked=False),
                clock=clock, config=quick())
    assert m["honest"].failure is None
    assert "escaped the measured stream" in m["side-stream"].failure
    assert "current_stream" in m["side-stream"].failure


def test_an_escape_just_under_the_limit_passes_and_just_over_fails():
    config = quick()
    limit = engine.escape_limit(1e-3, 0.0, config)  # 5 us + 50 us
    for escaped, fails in ((0.9 * limit, False), (1.1 * limit, True)):
        clock = FakeClock({"a": 1e-3}, escaped={"a": escaped})
        m = measure([Contender("a", doubler)], feed(checked=False), clock=clock, config=config)
        assert (m["a"].failure is not None) is fails


def test_scopes_are_entered_around_every_call():
    seen = []

    class Scope:
        def __enter__(self):
            seen.append("enter")

        def __exit__(self, *exc):
            seen.append("exit")

    def fn(x):
        seen.append("call")
        return x

    measure([Contender("a", fn, scope=Scope)], feed(checked=False), clock=FakeClock({}, default=MS),
            config=quick(min_runs=2, min_warmup_runs=1))
    assert seen[:6] == ["enter", "call", "exit", "enter", "call", "exit"]
    assert seen.count("call") == seen.count("enter") == seen.count("exit")


def test_the_perf_counter_clock_times_cpu_contenders():
    m = measure([Contender("a", doubler), Contender("b", lambda x: x + x)], feed(size=64),
                clock=PerfCounterClock(), config=quick(max_time=0.2, target_rse=0.5), compare=table)
    for key in "ab":
        assert m[key].failure is None
        assert m[key].summary.n >= 10
        assert all(s > 0 for s in m[key].samples)
        assert m[key].escapes == [0.0] * m[key].summary.n
    assert m.clock == "perf-counter"


def test_measure_rejects_duplicate_keys_and_empty_lineups():
    with pytest.raises(ValueError, match="distinct"):
        measure([Contender("a", doubler), Contender("a", doubler)], feed(checked=False), clock=FakeClock({}, default=MS))
    with pytest.raises(ValueError):
        measure([], feed(checked=False), clock=FakeClock({}, default=MS))


def test_measurement_json_names_every_contender_with_its_statistics():
    m = measure([Contender("a", doubler, "A label")], feed(checked=False), clock=FakeClock({"a": MS}), config=quick())
    data = m.to_json()
    assert data["stop_reason"] == "target_rse"
    assert data["inputs_drawn"] == m.inputs_drawn >= 2 * m.rounds and data["draw_s"] >= 0
    (entry,) = data["contenders"]
    assert entry["key"] == "a" and entry["label"] == "A label"
    assert entry["median_s"] == pytest.approx(MS) and entry["iqr_s"] == 0.0 and entry["n"] == 10


def test_the_output_check_reports_the_comparisons_table_and_needs_a_comparison():
    wrong = Contender("wrong", lambda x: x * 2 + torch.tensor([0.0, 100.0, 0.0]))
    m = measure([Contender("right", lambda x: x * 2), wrong], feed(size=3),
                clock=FakeClock({}, default=MS), config=quick(), compare=table)
    assert m["right"].failure is None
    assert "1 of 3" in m["wrong"].failure and "[1]" in m["wrong"].failure, m["wrong"].failure
    with pytest.raises(ValueError, match="needs `compare`"):
        measure([wrong], feed(size=3), clock=FakeClock({}, default=MS), config=quick())


def test_replacing_a_timing_function_is_noticed(monkeypatch):
    assert clocks.tampered() == []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 0.001)
    assert clocks.tampered() == ["torch.cuda.synchronize", "torch.cuda.Event.elapsed_time"]
    monkeypatch.undo()
    assert clocks.tampered() == []


def test_the_engine_keeps_the_functions_bound_at_import(monkeypatch):
    # A replaced time.perf_counter does not reach the engine's CPU clock.
    monkeypatch.setattr("time.perf_counter", lambda: 0.0)
    sample = PerfCounterClock().time("a", lambda: sum(range(1000)))
    assert sample.seconds > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_the_cuda_clock_catches_work_on_a_side_stream():
    a = torch.randn(2048, 2048, device="cuda")
    side = torch.cuda.Stream()

    def honest(x):
        return x @ x

    def hidden(x):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = x @ x
            for _ in range(4):
                out = out @ x
        return out

    m = measure([Contender("honest", honest, check=False), Contender("hidden", hidden, check=False)],
                Feed(lambda n: [a]), clock=clocks.CudaClock(), config=Config(warmup=0.1, max_time=2.0))
    assert m["honest"].failure is None
    assert "escaped the measured stream" in m["hidden"].failure


def test_every_round_times_each_contender_queued_and_from_an_idle_device():
    clock = FakeClock({"a": MS, "b": 2 * MS}, latency={"a": 5 * MS, "b": 3 * MS})
    m = measure([Contender("a", doubler), Contender("b", doubler)], feed(checked=False), clock=clock,
                config=quick(min_runs=10))
    assert m["a"].device == [MS] * m.rounds and m["a"].latency == [5 * MS] * m.rounds
    assert m["b"].device_summary.median == pytest.approx(2 * MS)
    assert m["b"].latency_summary.median == pytest.approx(3 * MS)
    # Round 1 (after warm-up and the untimed queued pass): b then a queued, then b then a alone.
    warm = m["a"].warmup_runs + m["b"].warmup_runs + 2
    assert clock.calls[warm + 4:warm + 8] == ["b", "a", "b", "a"]


@pytest.mark.parametrize("clock_name, gated", [("device", MS), ("latency", 5 * MS)])
def test_the_clock_setting_chooses_the_figure_that_the_stop_rule_and_the_gate_use(clock_name, gated):
    clock = FakeClock({"a": MS}, latency={"a": 5 * MS})
    m = measure([Contender("a", doubler)], feed(checked=False), clock=clock, config=quick(clock=clock_name))
    assert m.gate_clock == clock_name
    assert m["a"].summary.median == pytest.approx(gated)
    assert m.to_json()["gate_clock"] == clock_name


def test_an_unknown_clock_is_refused():
    with pytest.raises(ValueError, match="unknown clock 'wall'"):
        Config(clock="wall")


def test_both_runs_of_a_checked_round_are_compared_with_the_reference():
    m = measure([Contender("a", doubler)], feed(), clock=FakeClock({}, default=MS), config=quick(min_runs=2),
                compare=table)
    assert m["a"].failure is None
    assert m["a"].checked >= 4  # rounds 0 and 1 (the first rounds are checked), two runs each


def test_a_contender_that_cheats_only_when_queued_fails_the_output_check():
    class QueueOnlyCheat(FakeClock):
        """Runs queued calls on a flag the contender can read (a stand-in for a contender
        that notices the device is busy)."""

        queued = False

        def queue(self, runs):
            QueueOnlyCheat.queued = True
            try:
                return super().queue(runs)
            finally:
                QueueOnlyCheat.queued = False

    def cheat(x):
        return torch.zeros_like(x) if QueueOnlyCheat.queued else x * 2

    m = measure([Contender("cheat", cheat)], feed(), clock=QueueOnlyCheat({}, default=MS), config=quick(),
                compare=table)
    assert "(queued, input set" in m["cheat"].failure


def test_an_error_in_a_queued_run_fails_that_contender_only():
    class Failing(FakeClock):
        def queue(self, runs):
            out = super().queue(runs)
            return [RuntimeError("launch failed") if key == "bad" and len(self.calls) > 12 else o
                    for (key, *_), o in zip(runs, out)]

    m = measure([Contender("bad", doubler), Contender("good", doubler)], feed(checked=False),
                clock=Failing({}, default=MS), config=quick())
    assert m["bad"].failure == "raised RuntimeError: launch failed"
    assert m["good"].failure is None and m["good"].summary.n == 10


def test_the_perf_counter_clock_gives_both_figures_on_the_cpu():
    m = measure([Contender("a", doubler)], feed(size=64, checked=False), clock=PerfCounterClock(),
                config=quick(max_time=0.2, target_rse=0.5))
    assert len(m["a"].device) == len(m["a"].latency) == m["a"].summary.n >= 10
    assert all(v > 0 for v in m["a"].device + m["a"].latency)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_a_cuda_batch_chains_its_events_and_gives_every_call_a_figure():
    def add(x):
        return x + 1

    def draw(n):
        return [torch.randn(1 << 20, generator=torch.Generator().manual_seed(n)).cuda()]

    clock = clocks.CudaClock("cuda")
    assert clock.max_batch == 16   # on a GPU at most 16 calls a batch (perf/clocks.py says why)
    clock.max_batch = 4
    m = measure([Contender("a", add), Contender("b", add)], Feed(draw, add), clock=clock,
                config=quick(max_batch=4, batch_window=1.0, max_time=0.2, target_rse=0.5), compare=table)
    assert m.batch == 4
    assert len(m["a"].device) == 4 * len(m["a"].latency) and all(v > 0 for v in m["a"].device)
    # Back to back after one flush: a batch's later calls are no slower than its first.
    later = sorted(m["a"].device[i] for i in range(len(m["a"].device)) if i % 4)
    assert later[len(later) // 2] <= 1.5 * max(m["a"].device[::4])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_device_time_leaves_out_the_launches_that_latency_counts():
    x = torch.randn(256, device="cuda")

    def launches(v):  # 50 tiny kernels: launch-bound
        for _ in range(50):
            v = v + 1
        return v

    m = measure([Contender("tiny", launches, check=False)], Feed(lambda n: [x]), clock=clocks.CudaClock(),
                config=Config(warmup=0.1, max_time=2.0))
    r = m["tiny"]
    assert r.failure is None
    assert r.latency_summary.median > 1.5 * r.device_summary.median
    assert m.behind_rounds <= m.queued_rounds // 10


def test_the_candidate_is_checked_on_every_call_so_a_replay_after_the_first_rounds_fails():
    """A contender that turns to replaying its last output once the checked first rounds are
    past escapes sampled checks (check_fraction 0 here); marked every_call, it fails."""
    def late_replay():
        calls, last = [0], [None]

        def run(x):
            calls[0] += 1
            if calls[0] > 20 and last[0] is not None:
                return last[0].clone()
            last[0] = x * 2
            return last[0]
        return run

    config = quick(min_runs=30, checked_rounds=2, check_fraction=0.0)
    m = measure([Contender("sampled", late_replay()), Contender("custom", late_replay(), every_call=True)],
                feed(), clock=FakeClock({}, default=MS), config=config, compare=table)
    assert m["sampled"].failure is None  # sampling misses it: why the candidate is checked every call
    assert "differs from the reference" in m["custom"].failure, m["custom"].failure


def test_each_contender_of_a_pass_runs_a_batch_sized_from_the_fastest_warm_up():
    """The fastest contender's call takes 0.5 ms: batches of 4 make its batch last the 2 ms window
    (at most max_batch); each contender's calls of a pass come back to back, every one on a
    fresh input set, and every one gives a device sample."""
    contenders = [Contender(k, doubler) for k in "ab"]
    clock = FakeClock({"a": 0.5 * MS, "b": 3 * MS})
    m = measure(contenders, feed(), clock=clock, config=quick(max_batch=8, min_runs=12), compare=table)
    assert m.batch == 4 and m.to_json()["batch"] == 4
    first_pass = [key for r, key, _ in m.schedule if r == 0]
    assert first_pass == ["a"] * 4 + ["b"] * 4 + ["a", "b"]   # the batches, then a latency run each
    assert len({index for _, _, index in m.schedule}) == len(m.schedule)
    assert len(m["a"].device) == 4 * m.rounds and len(m["a"].latency) == m.rounds
    assert len(m["a"].samples) == len(m["a"].device)
    capped = measure(contenders, feed(), clock=FakeClock({"a": 0.5 * MS, "b": 3 * MS}),
                     config=quick(max_batch=3), compare=table)
    assert capped.batch == 3


def test_a_batch_checks_every_call_of_the_candidate_and_the_first_of_the_others():
    m = measure([Contender("base", doubler), Contender("custom", doubler, every_call=True)], feed(),
                clock=FakeClock({}, default=MS), config=quick(max_batch=3, checked_rounds=1000), compare=table)
    rounds, batch = m.rounds, m.batch
    assert batch == 2 and rounds >= 5
    assert m["base"].checked == 2 * rounds                  # its batch's first call and its latency run
    assert m["custom"].checked == batch * rounds + rounds   # every call


def test_a_pass_keeps_every_calls_output_until_it_is_done_as_a_workers_batch_does():
    """A call whose output went into the block the call before it had just freed would find that
    block in L2 (~10% faster on an H200 for a kernel whose call fits in L2), while a worker's
    batch keeps all its outputs: every contender's are kept until the pass is done. Under
    one_check_per_pass (memory-bound problems) the unchecked ones are dropped at once."""
    import weakref

    def most_alive(config) -> int:
        made: list = []
        alive: list[int] = []

        def fn(x):
            alive.append(sum(ref() is not None for ref in made))
            out = x * 2
            made.append(weakref.ref(out))
            return out

        m = measure([Contender("a", fn)], feed(), clock=FakeClock({}, default=MS), config=config, compare=table)
        assert m.batch == 4 and m["a"].failure is None
        return max(alive)

    assert most_alive(quick(max_batch=4, batch_window=1.0, max_rounds=3, checked_rounds=0)) >= 3
    assert most_alive(quick(max_batch=4, batch_window=1.0, max_rounds=3, checked_rounds=0,
                            one_check_per_pass=True)) <= 1
