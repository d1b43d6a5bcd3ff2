"""The timing engine on CPU contenders: order, warm-up, stop rule, output checks, escapes, tampering."""

from collections import Counter

import pytest
import torch

from pytest_cudaopt import tensors
from pytest_cudaopt.correctness.compare import compare_outputs
from pytest_cudaopt.perf import clocks, engine
from pytest_cudaopt.perf.clocks import FakeClock, PerfCounterClock
from pytest_cudaopt.perf.engine import Config, Contender, measure

MS = 1e-3


def doubler(x):
    return x * 2


def sets(n=3, size=8):
    gen = torch.Generator().manual_seed(0)
    inputs = [[torch.randn(size, generator=gen)] for _ in range(n)]
    return inputs, [s[0] * 2 for s in inputs]


def table(output, expected):
    """The perf item's output check: the correctness comparison at its default tolerances."""
    result = compare_outputs(output, expected)
    return None if result.passed else result.table()


def quick(**overrides):
    values = dict(warmup=0.0, min_warmup_runs=1, max_time=10.0, target_rse=0.01, min_runs=10)
    values.update(overrides)
    return Config(**values)


def test_contenders_are_interleaved_with_a_rotating_start_on_a_shared_input_set():
    inputs, expected = sets(3)
    contenders = [Contender(k, doubler) for k in "abc"]
    m = measure(contenders, inputs, clock=FakeClock({}, default=MS), config=quick(), expected=expected, compare=table)
    assert m.schedule[:9] == [
        (0, "a", 0), (0, "b", 0), (0, "c", 0),
        (1, "b", 1), (1, "c", 1), (1, "a", 1),
        (2, "c", 2), (2, "a", 2), (2, "b", 2),
    ]
    firsts = Counter(key for (r, key, _), i in zip(m.schedule, range(len(m.schedule))) if i % 3 == 0)
    assert set(firsts) == {"a", "b", "c"}
    assert max(firsts.values()) - min(firsts.values()) <= 1


def test_round_order_rotates_by_the_round_number():
    assert engine.round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert engine.round_order(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert engine.round_order(["a", "b", "c"], 5) == ["c", "a", "b"]


def test_identical_runs_stop_at_min_runs_by_the_error_target():
    inputs, _ = sets(2)
    m = measure([Contender("a", doubler), Contender("b", doubler)], inputs,
                clock=FakeClock({"a": MS, "b": 2 * MS}), config=quick(min_runs=12))
    assert m.stop_reason == "target_rse"
    assert m.rounds == 12
    assert m["a"].summary.median == pytest.approx(MS)
    assert m["b"].summary.median == pytest.approx(2 * MS)
    assert m["a"].summary.iqr == 0.0


def test_noisy_runs_stop_at_the_time_cap():
    inputs, _ = sets(2)
    # 1, 2, 3, 4 ms over and over: the error never reaches 1e-9.
    clock = FakeClock({"a": [MS, 2 * MS, 3 * MS, 4 * MS]})
    m = measure([Contender("a", doubler)], inputs, clock=clock, config=quick(max_time=0.5, target_rse=1e-9))
    assert m.stop_reason == "max_time"
    assert 0.5 <= m.seconds < 0.5 + 2 * 4 * MS  # the round that crosses the cap completes (two runs each)
    assert m["a"].summary.median == pytest.approx(2.5 * MS)
    assert m["a"].summary.iqr == pytest.approx(1.5 * MS, rel=0.05)


def test_warm_up_runs_for_its_time_and_at_least_min_warmup_runs():
    inputs, _ = sets(2)
    clock = FakeClock({"fast": 1 / 64, "slow": 0.25})  # binary fractions: exact virtual time
    m = measure([Contender("fast", doubler), Contender("slow", doubler)], inputs, clock=clock,
                config=quick(warmup=0.5, min_warmup_runs=3, min_runs=2))
    assert m["fast"].warmup_runs == 32     # 32 x 1/64 s = 0.5 s
    assert m["slow"].warmup_runs == 3      # 2 x 0.25 s would do, 3 is the minimum
    assert clock.calls[:35] == ["fast"] * 32 + ["slow"] * 3
    assert m["fast"].summary.n == m.rounds  # warm-up runs are not samples


def test_every_contender_gets_its_own_copies_of_the_inputs():
    inputs, expected = sets(2)

    def vandal(x):
        out = x * 2
        x.fill_(1e6)  # corrupts only its own copy
        return out

    m = measure([Contender("vandal", vandal, check=False), Contender("honest", doubler)], inputs,
                clock=FakeClock({}, default=MS), config=quick(), expected=expected, compare=table)
    assert m["honest"].failure is None
    assert torch.equal(inputs[0][0] * 2, expected[0])


class Replay:
    """Caches its output by the input's address (the values are never looked at)."""

    def __init__(self):
        self.cache = {}

    def __call__(self, x):
        if x.data_ptr() not in self.cache:
            self.cache[x.data_ptr()] = x * 2
        return self.cache[x.data_ptr()].clone()


def test_a_contender_that_replays_an_earlier_output_fails_the_output_check():
    inputs, expected = sets(3)

    m = measure([Contender("honest", doubler), Contender("replay", Replay())], inputs,
                clock=FakeClock({}, default=MS), config=quick(), expected=expected, compare=table)
    assert m["honest"].failure is None
    assert m["honest"].checked >= 3
    assert "differs from the reference" in m["replay"].failure
    assert "input set" in m["replay"].failure


def test_shared_inputs_are_one_copy_for_all_and_still_catch_a_replayed_output():
    inputs, expected = sets(3)
    seen = {"honest": set(), "other": set()}

    def recording(key):
        def fn(x):
            seen[key].add(x.data_ptr())
            return x * 2
        return fn

    m = measure([Contender("honest", recording("honest")), Contender("other", recording("other")),
                 Contender("replay", Replay())], inputs, clock=FakeClock({}, default=MS),
                config=quick(share_inputs=True), expected=expected, compare=table)
    assert seen["honest"] == seen["other"] and len(seen["honest"]) == 3   # the same three tensors
    assert m["honest"].failure is None and m["other"].failure is None
    assert "differs from the reference" in m["replay"].failure


def test_shared_inputs_keep_one_queued_output_per_round_not_one_per_contender():
    # Memory-bound problems share their inputs because a copy per contender does not fit; a
    # queued round holding every contender's output would not fit either.
    import weakref

    inputs, expected = sets(3)
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
    m = measure([Contender(k, tracked) for k in keys], inputs, clock=FakeClock({}, default=MS),
                config=quick(share_inputs=True, check_fraction=1.0), expected=expected, compare=table)
    assert all(m[k].failure is None and m[k].checked >= 3 for k in keys)
    assert most[0] <= 2    # the kept queued output and the call running now
    private = measure([Contender(k, tracked) for k in keys], inputs, clock=FakeClock({}, default=MS),
                      config=quick(check_fraction=1.0), expected=expected, compare=table)
    assert all(private[k].failure is None for k in keys)
    assert most[0] == len(keys)   # with private copies, each contender's queued output is checked


def test_a_contender_that_changes_once_timing_starts_fails():
    inputs, expected = sets(2)
    calls = Counter()

    def lazy(x):
        calls["n"] += 1
        return x * 2 if calls["n"] <= 3 else torch.zeros_like(x)

    m = measure([Contender("lazy", lazy)], inputs, clock=FakeClock({}, default=MS),
                config=quick(min_warmup_runs=3), expected=expected, compare=table)
    assert "differs from the reference" in m["lazy"].failure
    assert m.stop_reason == "all failed"


def test_a_contender_that_raises_is_marked_failed_and_the_others_continue():
    inputs, _ = sets(2)
    calls = Counter()

    def flaky(x):
        calls["n"] += 1
        if calls["n"] == 6:
            raise ValueError("kernel launch failed")
        return x * 2

    m = measure([Contender("flaky", flaky), Contender("steady", doubler)], inputs,
                clock=FakeClock({}, default=MS), config=quick(min_warmup_runs=2, min_runs=10))
    assert m["flaky"].failure == "raised ValueError: kernel launch failed"
    assert isinstance(m["flaky"].error, ValueError)
    assert m["steady"].failure is None
    assert m["steady"].summary.n == 10


def test_work_that_escapes_the_measured_stream_fails_with_that_reason():
    inputs, _ = sets(2)
    clock = FakeClock({"honest": 100e-6, "side-stream": 20e-6},
                      escaped={"honest": 3e-6, "side-stream": 500e-6}, escape_floor=2e-6)
    m = measure([Contender("honest", doubler), Contender("side-stream", doubler)], inputs,
                clock=clock, config=quick())
    assert m["honest"].failure is None
    assert "escaped the measured stream" in m["side-stream"].failure
    assert "current_stream" in m["side-stream"].failure


def test_an_escape_just_under_the_limit_passes_and_just_over_fails():
    inputs, _ = sets(1)
    config = quick()
    limit = engine.escape_limit(1e-3, 0.0, config)  # 5 us + 50 us
    for escaped, fails in ((0.9 * limit, False), (1.1 * limit, True)):
        clock = FakeClock({"a": 1e-3}, escaped={"a": escaped})
        m = measure([Contender("a", doubler)], inputs, clock=clock, config=config)
        assert (m["a"].failure is not None) is fails


def test_scopes_are_entered_around_every_call():
    inputs, _ = sets(1)
    seen = []

    class Scope:
        def __enter__(self):
            seen.append("enter")

        def __exit__(self, *exc):
            seen.append("exit")

    def fn(x):
        seen.append("call")
        return x

    measure([Contender("a", fn, scope=Scope)], inputs, clock=FakeClock({}, default=MS),
            config=quick(min_runs=2, min_warmup_runs=1))
    assert seen[:6] == ["enter", "call", "exit", "enter", "call", "exit"]
    assert seen.count("call") == seen.count("enter") == seen.count("exit")


def test_the_perf_counter_clock_times_cpu_contenders():
    inputs, expected = sets(2, size=64)
    m = measure([Contender("a", doubler), Contender("b", lambda x: x + x)], inputs,
                clock=PerfCounterClock(), config=quick(max_time=0.2, target_rse=0.5), expected=expected, compare=table)
    for key in "ab":
        assert m[key].failure is None
        assert m[key].summary.n >= 10
        assert all(s > 0 for s in m[key].samples)
        assert m[key].escapes == [0.0] * m[key].summary.n
    assert m.clock == "perf-counter"


def test_measure_rejects_duplicate_keys_and_empty_lineups():
    inputs, _ = sets(1)
    with pytest.raises(ValueError, match="distinct"):
        measure([Contender("a", doubler), Contender("a", doubler)], inputs, clock=FakeClock({}, default=MS))
    with pytest.raises(ValueError):
        measure([], inputs, clock=FakeClock({}, default=MS))


def test_measurement_json_names_every_contender_with_its_statistics():
    inputs, _ = sets(2)
    m = measure([Contender("a", doubler, "A label")], inputs, clock=FakeClock({"a": MS}), config=quick())
    data = m.to_json()
    assert data["stop_reason"] == "target_rse"
    (entry,) = data["contenders"]
    assert entry["key"] == "a" and entry["label"] == "A label"
    assert entry["median_s"] == pytest.approx(MS) and entry["iqr_s"] == 0.0 and entry["n"] == 10


def test_the_output_check_reports_the_comparisons_table_and_needs_a_comparison():
    inputs = [[torch.ones(3)], [torch.full((3,), 2.0)]]
    expected = [x * 2 for (x,) in inputs]
    wrong = Contender("wrong", lambda x: x * 2 + torch.tensor([0.0, 1.0, 0.0]))
    m = measure([Contender("right", lambda x: x * 2), wrong], inputs,
                clock=FakeClock({}, default=MS), config=quick(), expected=expected, compare=table)
    assert m["right"].failure is None
    assert "1 of 3" in m["wrong"].failure and "[1]" in m["wrong"].failure, m["wrong"].failure
    with pytest.raises(ValueError, match="needs `compare`"):
        measure([wrong], inputs, clock=FakeClock({}, default=MS), config=quick(), expected=expected)


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
                [[a]], clock=clocks.CudaClock(), config=Config(warmup=0.1, max_time=2.0))
    assert m["honest"].failure is None
    assert "escaped the measured stream" in m["hidden"].failure


def test_every_round_times_each_contender_queued_and_from_an_idle_device():
    inputs, _ = sets(2)
    clock = FakeClock({"a": MS, "b": 2 * MS}, latency={"a": 5 * MS, "b": 3 * MS})
    m = measure([Contender("a", doubler), Contender("b", doubler)], inputs, clock=clock, config=quick(min_runs=10))
    assert m["a"].device == [MS] * m.rounds and m["a"].latency == [5 * MS] * m.rounds
    assert m["b"].device_summary.median == pytest.approx(2 * MS)
    assert m["b"].latency_summary.median == pytest.approx(3 * MS)
    # Round 1 (after warm-up and the untimed queued pass): b then a queued, then b then a alone.
    warm = m["a"].warmup_runs + m["b"].warmup_runs + 2
    assert clock.calls[warm + 4:warm + 8] == ["b", "a", "b", "a"]


@pytest.mark.parametrize("clock_name, gated", [("device", MS), ("latency", 5 * MS)])
def test_the_clock_setting_chooses_the_figure_that_the_stop_rule_and_the_gate_use(clock_name, gated):
    inputs, _ = sets(2)
    clock = FakeClock({"a": MS}, latency={"a": 5 * MS})
    m = measure([Contender("a", doubler)], inputs, clock=clock, config=quick(clock=clock_name))
    assert m.gate_clock == clock_name
    assert m["a"].summary.median == pytest.approx(gated)
    assert m.to_json()["gate_clock"] == clock_name


def test_an_unknown_clock_is_refused():
    with pytest.raises(ValueError, match="unknown clock 'wall'"):
        Config(clock="wall")


def test_both_runs_of_a_checked_round_are_compared_with_the_reference():
    inputs, expected = sets(2)
    m = measure([Contender("a", doubler)], inputs, clock=FakeClock({}, default=MS), config=quick(min_runs=2),
                expected=expected, compare=table)
    assert m["a"].failure is None
    assert m["a"].checked >= 4  # rounds 0 and 1 (one per input set), two runs each


def test_a_contender_that_cheats_only_when_queued_fails_the_output_check():
    inputs, expected = sets(2)

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

    m = measure([Contender("cheat", cheat)], inputs, clock=QueueOnlyCheat({}, default=MS), config=quick(),
                expected=expected, compare=table)
    assert "(queued, input set" in m["cheat"].failure


def test_an_error_in_a_queued_run_fails_that_contender_only():
    inputs, _ = sets(2)

    class Failing(FakeClock):
        def queue(self, runs):
            out = super().queue(runs)
            return [RuntimeError("launch failed") if key == "bad" and len(self.calls) > 12 else o
                    for (key, _, _), o in zip(runs, out)]

    m = measure([Contender("bad", doubler), Contender("good", doubler)], inputs, clock=Failing({}, default=MS),
                config=quick())
    assert m["bad"].failure == "raised RuntimeError: launch failed"
    assert m["good"].failure is None and m["good"].summary.n == 10


def test_the_perf_counter_clock_gives_both_figures_on_the_cpu():
    inputs, _ = sets(2, size=64)
    m = measure([Contender("a", doubler)], inputs, clock=PerfCounterClock(), config=quick(max_time=0.2, target_rse=0.5))
    assert len(m["a"].device) == len(m["a"].latency) == m["a"].summary.n >= 10
    assert all(v > 0 for v in m["a"].device + m["a"].latency)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
def test_device_time_leaves_out_the_launches_that_latency_counts():
    x = torch.randn(256, device="cuda")

    def launches(v):  # 50 tiny kernels: launch-bound
        for _ in range(50):
            v = v + 1
        return v

    m = measure([Contender("tiny", launches, check=False)], [[x]], clock=clocks.CudaClock(),
                config=Config(warmup=0.1, max_time=2.0))
    r = m["tiny"]
    assert r.failure is None
    assert r.latency_summary.median > 1.5 * r.device_summary.median
    assert m.behind_rounds <= m.queued_rounds // 10
