"""The timing engine's statistics, checked against numbers worked out by hand."""

import math

import pytest

from pytest_cudaopt.perf import engine, stats
from pytest_cudaopt.perf.engine import Config, precise_enough
from pytest_cudaopt.perf.stats import Summary, iqr, median, median_standard_error, quartiles, relative_standard_error


def test_quartiles_interpolate_linearly_between_order_statistics():
    # Sorted 10 20 30 40: q25 at position 0.75 -> 17.5, median at 1.5 -> 25, q75 at 2.25 -> 32.5.
    values = [40.0, 10.0, 30.0, 20.0]
    assert quartiles(values) == pytest.approx((17.5, 25.0, 32.5))
    assert median(values) == pytest.approx(25.0)
    assert iqr(values) == pytest.approx(15.0)
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)


def test_median_of_an_odd_count_is_the_middle_value():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([7.0]) == 7.0


def test_quartiles_and_median_reject_no_values():
    with pytest.raises(ValueError):
        quartiles([])
    with pytest.raises(ValueError):
        median([])


def test_median_standard_error_uses_the_iqr_estimate_of_sigma():
    # 1..9: IQR = 7 - 3 = 4, sigma = 4 / 1.349 = 2.96516, SE = 1.2533 * 2.96516 / sqrt(9) = 1.23874,
    # RSE = 1.23874 / 5 = 0.247749.
    values = [float(v) for v in range(1, 10)]
    assert median_standard_error(values) == pytest.approx(1.238745, rel=1e-6)
    assert relative_standard_error(values) == pytest.approx(0.247749, rel=1e-5)
    # 10 20 30 40: IQR 15, SE = 1.2533 * (15 / 1.349) / 2 = 6.96794, RSE = 6.96794 / 25 = 0.278718.
    assert median_standard_error([10.0, 20.0, 30.0, 40.0]) == pytest.approx(6.967939, rel=1e-6)
    assert relative_standard_error([10.0, 20.0, 30.0, 40.0]) == pytest.approx(0.278718, rel=1e-5)


def test_the_standard_error_shrinks_with_the_square_root_of_n():
    # The same spread, four times the runs: half the error.
    few = [1.0, 2.0, 3.0, 4.0, 5.0]
    many = [v for v in few for _ in range(4)]
    assert iqr(few) == pytest.approx(2.0)
    assert iqr(many) == pytest.approx(2.0)
    assert median_standard_error(many) == pytest.approx(median_standard_error(few) * math.sqrt(5 / 20))


def test_standard_error_is_infinite_when_it_cannot_be_estimated():
    assert median_standard_error([1.0]) == math.inf
    assert relative_standard_error([1.0]) == math.inf
    assert relative_standard_error([0.0, 0.0, 0.0]) == math.inf


def test_identical_runs_have_no_error():
    assert relative_standard_error([2e-3] * 10) == 0.0


def test_one_slow_outlier_barely_moves_the_error_estimate():
    steady = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0, 1.01]
    spiked = steady[:-1] + [100.0]
    assert relative_standard_error(spiked) < 2 * relative_standard_error(steady)


def test_summary_holds_median_quartiles_iqr_n_and_minimum():
    s = Summary.of([40.0, 10.0, 30.0, 20.0])
    assert (s.n, s.median, s.q1, s.q3, s.iqr, s.minimum) == (4, 25.0, 17.5, 32.5, 15.0, 10.0)
    assert s.rse == pytest.approx(0.278718, rel=1e-5)
    empty = Summary.of([])
    assert empty.n == 0 and math.isnan(empty.median) and empty.rse == math.inf


def test_the_stop_rule_needs_min_runs_and_a_small_enough_error_for_every_contender():
    config = Config(min_runs=4, target_rse=0.25)
    tight = [1.0, 1.0, 1.0, 1.0]                 # RSE 0
    loose = [10.0, 20.0, 30.0, 40.0]             # RSE 0.2787 (above)
    nine = [float(v) for v in range(1, 10)]      # RSE 0.2477 (below)
    assert precise_enough([tight, nine], config)
    assert not precise_enough([tight, loose], config)
    assert not precise_enough([tight[:3], nine], config)  # 3 < min_runs
    assert precise_enough([tight, loose], Config(min_runs=4, target_rse=0.28))


def test_escape_limit_is_floor_plus_absolute_plus_relative_share():
    config = Config(escape_abs=5e-6, escape_rel=0.05)
    # 2 us floor + 5 us + 5% of 1 ms = 57 us.
    assert engine.escape_limit(1e-3, 2e-6, config) == pytest.approx(57e-6)


def test_times_are_printed_with_three_significant_digits_and_a_unit():
    assert stats.format_seconds(1.5) == "1.50 s"
    assert stats.format_seconds(0.0123) == "12.3 ms"
    assert stats.format_seconds(456e-6) == "456 us"
    assert stats.format_seconds(3e-9) == "3.00 ns"
    assert stats.format_seconds(None) == "-"
    assert stats.format_seconds(math.nan) == "-"
