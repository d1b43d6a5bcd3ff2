"""The timed outputs held to the untimed precision (pytest_cudaopt.perf.timed_precision): the comparison's relative L2
error, the pooled untimed figure, the bound and its failure. End to end: tests/exploits/timed_subsample.py."""

import math

import pytest
import torch

from pytest_cudaopt.correctness.compare import compare_outputs
from pytest_cudaopt.correctness import precision
from pytest_cudaopt.correctness.precision import Precision, combined, pooled, relative_l2_error
from pytest_cudaopt.perf.timed_precision import Bound, TimedErrors, bound


def test_the_comparison_carries_the_relative_l2_error_of_every_float_output_over_its_finite_pairs():
    expected = (torch.randn(300, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64))
    actual = tuple(e + 1e-3 * torch.randn_like(e) for e in expected)
    found = compare_outputs(actual, expected).relative_l2
    assert found == pytest.approx(relative_l2_error(actual, expected), rel=1e-9)
    # Integer outputs are compared exactly and carry none; an all-zero reference gives the error's RMS.
    assert compare_outputs(torch.arange(4), torch.arange(4)).relative_l2 is None
    assert compare_outputs(torch.full((4,), 3e-3), torch.zeros(4)).relative_l2 == pytest.approx(3e-3)
    # A NaN pair is left out (it is judged element-wise).
    with_nan = torch.tensor([1.0, float("nan"), 2.0])
    assert compare_outputs(with_nan * 1.01, with_nan).relative_l2 == pytest.approx(0.01)


def _p(candidate, reference=4e-8, tier="fp32"):
    return Precision(candidate, reference, tier)


def test_a_small_output_is_measured_over_several_input_sets_and_a_large_one_once():
    draws = iter([1e-6, 3e-6, 1e-6, 3e-6, 1e-6, 3e-6, 1e-6, 3e-6, 99.0])
    calls = []

    def measure():
        calls.append(1)
        return _p(next(draws))

    found = pooled(measure, elements=1)
    assert len(calls) == precision.POOL_SETS and found.candidate_error == pytest.approx(math.sqrt(5e-12))
    assert found.tier == "fp32" and "over 8 input sets" in found.describe()
    calls.clear()
    assert pooled(lambda: (calls.append(1), _p(2e-7))[1], elements=4096).candidate_error == 2e-7 and len(calls) == 1
    assert len([pooled(lambda: _p(1e-7), elements=1024)]) == 1   # 4 sets reach 4096 elements
    unknown = Precision(math.nan, math.nan, "unknown", "no float64 run")
    assert pooled(lambda: unknown, elements=1) is unknown
    assert found.sets == 8 and found.steady(1) and not _p(1e-6).steady(1) and _p(1e-6).steady(4096)
    # A wrong set ends the pool: its precision is the answer.
    wrong = iter([_p(1e-6), _p(0.5, tier="wrong"), _p(1e-6)])
    assert pooled(lambda: next(wrong), elements=1).tier == "wrong"
    assert Precision.from_json(found.to_json()) == found
    # A set whose float64 run did not fit is left out of the pool, not made its figure.
    partly = combined([_p(1e-6), Precision(math.nan, math.nan, "unknown", "float64 reference skipped"), _p(3e-6)])
    assert partly.sets == 2 and partly.candidate_error == pytest.approx(math.sqrt(5e-12)) and partly.tier == "fp32"


def test_the_bound_is_four_times_the_untimed_error_and_never_below_the_fp32_edge():
    assert bound(_p(1e-8), "fp32", 1e-2).value == pytest.approx(1e-5 + 4e-8)        # the fp32 floor
    assert bound(_p(4e-4, tier="tf32-like"), "tf32-like", 1e-2).value == pytest.approx(1.6e-3 + 4e-8)
    # A less precise tier from the correctness items leaves the figure measured here as the bound's.
    assert bound(_p(1e-8), "half-like", 1e-2).value == pytest.approx(1e-5 + 4e-8)
    assert bound(Precision(0.0, 0.0, "exact"), "exact", 1e-2) is None
    unmeasured = bound(Precision(math.nan, math.nan, "unknown"), "unknown", 1e-2)
    assert unmeasured.value == 1e-2 and "not measured" in unmeasured.why


def test_the_check_stages_figure_on_model_values_bounds_too_where_it_is_steady():
    """A worker that computes less in the perf stage's own correctness calls than in the check stage's gains nothing."""
    own, checked = _p(2e-3, tier="half-like"), [_p(3e-6), _p(5e-6)]
    held = bound(own, "half-like", 1e-2, checked, elements=4096)
    assert held.value == pytest.approx(1.2e-5 + 4e-8) and "its correctness items measured" in held.why
    assert bound(own, "half-like", 1e-2, checked, elements=100).value == pytest.approx(8e-3 + 4e-8)   # a noisy draw
    assert bound(Precision(math.nan, math.nan, "unknown"), "fp32", 1e-2, checked, elements=10**6).value == \
        pytest.approx(1.2e-5 + 4e-8)   # the perf stage's own measurement ran out of memory
    # A small output's check-stage figure bounds once it is pooled over enough input sets (its canonical item's).
    steady = combined([_p(3e-6)] * precision.pool_sets(100))
    assert steady.sets == precision.pool_sets(100) == precision.POOL_SETS
    assert bound(own, "half-like", 1e-2, [steady], elements=100).value == pytest.approx(1.2e-5 + 4e-8)
    assert bound(own, "half-like", 1e-2, [combined([_p(3e-6)] * 2)], elements=100).value == \
        pytest.approx(8e-3 + 4e-8)   # two sets of 100 elements: still a draw


def test_timed_errors_fail_a_contender_whose_timed_outputs_are_less_precise_than_its_bound():
    expected = torch.randn(1000, dtype=torch.float64)
    timed = TimedErrors({"custom": Bound(1e-5, "the 1e-08 measured on its untimed calls (fp32) allows 1e-05")})
    for scale in (1e-8, 2e-8):
        timed.add("custom", compare_outputs(expected * (1 + scale), expected))
        timed.add("compile", compare_outputs(expected * 1.1, expected))   # no bound: not held
    assert timed.failure("custom") is None and timed.failure("compile") is None
    for _ in range(2):
        timed.add("custom", compare_outputs(expected * (1 + 4e-3), expected))   # within atol and rtol
    failure = timed.failure("custom")
    assert failure.startswith("its timed outputs are less precise than its untimed ones: relative L2 error 2.83e-03")
    assert "over 4 checked timed calls" in failure and failure.endswith("allows 1e-05")
    assert timed.to_json() == {"custom": {"bound": 1e-5, "error": pytest.approx(2.83e-3, rel=1e-2), "calls": 4,
                                          "baseline_error": None}}


def test_where_the_timed_inputs_make_torch_compile_drift_too_a_contender_may_drift_four_times_as_far():
    """Worse conditioned timed inputs than the untimed ones: float32 itself drifts, and that is no one's fault."""
    expected = torch.randn(1000, dtype=torch.float64)
    timed = TimedErrors({"custom": Bound(1e-5, "measured")}, baseline="compile")
    timed.add("custom", compare_outputs(expected * (1 + 3e-5), expected))
    assert timed.failure("custom").endswith("where measured")   # no baseline figure yet: its own bound
    timed.add("compile", compare_outputs(expected * (1 + 1e-5), expected))
    assert timed.failure("custom") is None and timed.limit("custom").value == pytest.approx(4e-5, rel=1e-6)
    assert timed.to_json()["custom"]["baseline_error"] == pytest.approx(1e-5, rel=1e-6)
    timed.add("custom", compare_outputs(expected * (1 + 2e-4), expected))
    failure = timed.failure("custom")
    assert "4x the 1.00e-05 of compile's timed outputs allows 4.00e-05 (measured)" in failure, failure
