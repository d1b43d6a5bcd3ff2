"""compare.py with hand-computed numbers: tolerance, NaN/Inf, structure, error table, precision tier."""

import math

import pytest
import torch

from pytest_cudaopt.results import report, records as results
from pytest_cudaopt.primitives import tensors
from pytest_cudaopt.correctness import compare, precision


def test_elements_within_atol_plus_rtol_times_expected_pass():
    expected = torch.tensor([1.0, 100.0, 0.0])
    # allowed: 0.01 + 0.01*1 = 0.02; 0.01 + 0.01*100 = 1.01; 0.01 + 0 = 0.01
    actual = torch.tensor([1.0199, 101.0, 0.0099])
    result = compare.compare_outputs(actual, expected, atol=1e-2, rtol=1e-2)
    assert result.passed
    assert result.max_abs == pytest.approx(1.0, rel=1e-9)
    assert result.max_rel == pytest.approx(0.0199, rel=1e-4)  # the zero expected element is left out


def test_one_element_just_outside_the_tolerance_fails_with_its_index_and_values():
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    actual = expected.clone()
    actual[1, 0] = 3.05  # allowed 0.01 + 0.03 = 0.04; diff 0.05
    result = compare.compare_outputs(actual, expected, atol=1e-2, rtol=1e-2)
    assert not result.passed
    assert result.mismatched == 1 and result.total == 4
    leaf = result.leaves[0]
    assert leaf.fraction == 0.25
    assert leaf.worst.index == (1, 0)
    assert leaf.worst.actual == pytest.approx(3.05, rel=1e-6) and leaf.worst.expected == 3.0
    assert leaf.max_abs == pytest.approx(0.05, rel=1e-5)
    assert leaf.max_rel == pytest.approx(0.05 / 3, rel=1e-5)
    table = result.table()
    assert "1 of 4 elements (25%)" in table
    assert "worst at [1, 0]: actual 3.05, expected 3" in table
    assert "first 1 mismatches" in table


def test_the_table_lists_at_most_five_mismatches_in_index_order():
    expected = torch.zeros(10)
    actual = torch.arange(10, dtype=torch.float32)  # every element but [0] is off
    result = compare.compare_outputs(actual, expected, atol=1e-2, rtol=1e-2)
    assert result.mismatched == 9
    assert [m.index for m in result.leaves[0].first] == [(1,), (2,), (3,), (4,), (5,)]
    assert result.leaves[0].worst.index == (9,)
    assert result.max_rel == 0.0  # every expected element is 0: no relative error defined


def test_nan_in_the_same_place_matches_and_nan_elsewhere_is_a_mismatch():
    expected = torch.tensor([1.0, math.nan, 3.0])
    assert compare.compare_outputs(expected.clone(), expected).passed
    actual = torch.tensor([math.nan, math.nan, 3.0])
    result = compare.compare_outputs(actual, expected)
    assert not result.passed
    assert result.nan_mismatched == 1 and result.mismatched == 1
    assert math.isnan(result.max_abs)  # like torch.testing: a NaN mismatch makes the error NaN
    assert result.leaves[0].worst.index == (0,)
    assert "NaN where the other is not: 1 elements" in result.table()


def test_inf_must_meet_the_same_inf():
    expected = torch.tensor([math.inf, -math.inf, 1.0])
    assert compare.compare_outputs(expected.clone(), expected).passed
    result = compare.compare_outputs(torch.tensor([math.inf, math.inf, 1.0]), expected)
    assert not result.passed and result.leaves[0].inf_mismatched == 1
    result = compare.compare_outputs(torch.tensor([1e30, -math.inf, 1.0]), expected)
    assert not result.passed and result.leaves[0].inf_mismatched == 1


def test_shape_dtype_and_structure_differences_are_named():
    e = torch.zeros(2, 3)
    shape = compare.compare_outputs(torch.zeros(3, 2), e)
    assert not shape.passed and "shape differs" in shape.reason and "float32[3, 2]" in shape.reason
    dtype = compare.compare_outputs(torch.zeros(2, 3, dtype=torch.float64), e)
    assert not dtype.passed and "dtype differs" in dtype.reason and "float64[2, 3]" in dtype.reason
    nest = compare.compare_outputs((e, e), e)
    assert not nest.passed and "output structure differs" in nest.reason and "tuple(" in nest.reason
    scalar = compare.compare_outputs((e, 3), (e, 4))
    assert not scalar.passed and "output[1]" in scalar.reason


def test_tuple_outputs_are_compared_leaf_by_leaf_with_their_paths():
    a = (torch.ones(2), torch.tensor([1.0, 5.0]))
    e = (torch.ones(2), torch.tensor([1.0, 2.0]))
    result = compare.compare_outputs(a, e)
    assert not result.passed
    assert [leaf.path for leaf in result.leaves] == ["output[0]", "output[1]"]
    assert "output[1]: 1 of 2 elements" in result.table()


def test_integer_outputs_must_match_exactly_under_the_default_tolerance():
    e = torch.tensor([1, 2, 3])
    assert compare.compare_outputs(e.clone(), e).passed
    assert not compare.compare_outputs(torch.tensor([1, 2, 4]), e).passed


def test_bitwise_equality_sees_the_last_bit_and_nan_payloads():
    a = torch.tensor([1.0, 2.0])
    b = a.clone()
    assert compare.bitwise_equal(a, b)
    b[1] = torch.nextafter(b[1], torch.tensor(math.inf))
    assert not compare.bitwise_equal(a, b)
    count, index, va, vb = compare.first_difference(a, b)
    assert (count, index, va) == (1, (1,), 2.0) and vb > 2.0
    nan = torch.tensor([math.nan])
    assert compare.bitwise_equal(nan, nan.clone())


def test_relative_l2_error_is_the_norm_of_the_difference_over_the_norm_of_the_reference():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)  # ||ref|| = 5
    actual = torch.tensor([3.0, 4.5])                     # ||diff|| = 0.5
    assert precision.relative_l2_error(actual, ref) == pytest.approx(0.1)
    assert precision.relative_l2_error(torch.tensor([0.5]), torch.zeros(1, dtype=torch.float64)) == 0.5


@pytest.mark.parametrize("candidate, reference, tier", [
    (1e-7, 1e-7, "fp32"),
    (9e-6, 1e-8, "fp32"),          # below the 1e-5 floor
    (5e-6, 4e-7, "fp32"),          # within 10x the reference's own error
    (4e-4, 1e-7, "tf32-like"),     # TF32 / fp16: a 10-bit mantissa
    (1e-3, 1e-7, "tf32-like"),
    (2.5e-3, 1e-7, "half-like"),   # bf16: an 8-bit mantissa
    (math.nan, 1e-7, "unknown"),
])
def test_precision_tier_thresholds(candidate, reference, tier):
    assert precision.precision_tier(candidate, reference) == tier


def test_rounding_to_bfloat16_measures_half_like_and_fp16_tf32_like():
    torch.manual_seed(0)
    ref64 = torch.randn(4096, dtype=torch.float64)
    ref32 = ref64.float()
    bf16 = precision.Precision.measure(ref32.bfloat16().float(), ref32, ref64)
    fp16 = precision.Precision.measure(ref32.half().float(), ref32, ref64)
    fp32 = precision.Precision.measure(ref32.clone(), ref32, ref64)
    assert bf16.tier == "half-like" and 1e-3 < bf16.candidate_error < 4e-3
    assert fp16.tier == "tf32-like" and 1e-4 < fp16.candidate_error < 1e-3
    assert fp32.tier == "fp32"


def test_measure_precision_runs_the_reference_in_float64():
    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * 3.0

    class Rounded(torch.nn.Module):
        def forward(self, x):
            return (x * 3.0).bfloat16().float()

    inputs = [torch.randn(1000)]
    assert precision.measure_precision(Scale(), Scale(), inputs).tier == "fp32"
    result = precision.measure_precision(Scale(), Rounded(), inputs)
    assert result.tier == "half-like" and "half-like: relative L2 error vs float64" in result.describe()


def test_a_correctness_result_renders_one_row_and_json():
    result = results.CorrectnessResult(
        workdir="/w", test="model_new.py::TestCorrectness::test_canonical[seed0]", case="canonical seed0",
        passed=False, shapes="x: float32[16, 64]", seed=7, max_abs=0.5, max_rel=0.25,
        precision=precision.Precision(1e-7, 1e-7, "fp32"), check="mismatch", message="table")
    row = report.correctness_row(result)
    assert row["verdict"] == "FAIL (mismatch)" and row["max abs err"] == "5.00e-01"
    assert row["precision"] == "fp32" and row["inputs"] == "x: float32[16, 64]"
    assert all(isinstance(v, str) for v in row.values())
    data = result.to_json()
    assert data["kind"] == "correctness" and data["passed"] is False
    assert data["precision"]["tier"] == "fp32" and data["seed"] == 7


# -- exact outputs, the relative L2 bound, all-zero references -----------------------------------

def test_integer_outputs_must_match_exactly_whatever_the_tolerance():
    expected = torch.arange(1000, 1010) * 3 + 1
    result = compare.compare_outputs(expected + 1, expected, atol=10.0, rtol=10.0)
    assert not result.passed
    assert result.mismatched == 10
    assert "exact equality (integer/bool output)" in result.table()
    assert compare.compare_outputs(expected.clone(), expected).passed


def test_int64_values_beyond_float64_precision_are_compared_exactly():
    big = torch.tensor([2 ** 60], dtype=torch.int64)
    assert not compare.compare_outputs(big + 1, big, atol=0.0, rtol=0.0).passed


def test_bool_and_int_outputs_are_labelled_exact_not_fp32():
    out = (torch.arange(6) > 2, torch.arange(6))
    p = precision.Precision.measure(out, out, out, max_rel_error=1e-2)
    assert p.tier == precision.EXACT
    assert "exact" in p.describe()


def test_zero_tolerances_demand_equality_of_floats():
    e = torch.tensor([1.0, 2.0])
    assert compare.compare_outputs(e.clone(), e, atol=0.0, rtol=0.0).passed
    assert not compare.compare_outputs(e + 1e-6, e, atol=0.0, rtol=0.0).passed


def test_a_fill_within_atol_of_tiny_outputs_is_wrong_by_relative_l2_error():
    x = torch.rand(16, 4096, dtype=torch.float64)
    ref64 = torch.softmax(x, dim=1)
    ref = ref64.float()
    fill = torch.full_like(ref, 1.0 / 4096)
    assert compare.compare_outputs(fill, ref, atol=1e-2, rtol=1e-2).passed  # allclose is blind here
    p = precision.Precision.measure(fill, ref, ref64, max_rel_error=1e-2)
    assert p.tier == precision.WRONG and p.wrong
    assert p.candidate_error == pytest.approx(0.288, abs=0.03)
    zeros = precision.Precision.measure(torch.zeros_like(ref), ref, ref64, max_rel_error=1e-2)
    assert zeros.tier == precision.WRONG and zeros.candidate_error == pytest.approx(1.0)
    honest = precision.Precision.measure(ref.clone(), ref, ref64, max_rel_error=1e-2)
    assert honest.tier == precision.FP32


def test_the_element_wise_tolerance_is_reported_vacuous_when_atol_covers_every_output():
    ref = torch.full((8,), 1e-4)
    assert compare.compare_outputs(ref.clone(), ref, atol=1e-2, rtol=1e-2).vacuous == ["output"]
    assert compare.compare_outputs(ref * 1e3, ref * 1e3, atol=1e-2, rtol=1e-2).vacuous == []


def test_an_all_zero_reference_judges_the_root_mean_square_of_the_candidate():
    ref64 = torch.zeros(100, dtype=torch.float64)
    assert precision.relative_l2_error(torch.zeros(100), ref64) == 0.0
    assert precision.relative_l2_error(torch.full((100,), 1e-3), ref64) == pytest.approx(1e-3)
    p = precision.Precision.measure(torch.full((100,), 0.5), ref64.float(), ref64, max_rel_error=1e-2)
    assert p.tier == precision.WRONG


def test_an_ill_conditioned_reference_widens_the_bound_to_ten_times_its_own_error():
    assert precision.error_bound(1e-2, 1e-1) == pytest.approx(1.0)
    assert precision.error_bound(1e-2, 1e-6) == 1e-2
    assert precision.error_bound(1e-2, math.nan) == 1e-2


def test_comparing_in_chunks_gives_the_same_table_as_at_once(monkeypatch):
    torch.manual_seed(0)
    expected = torch.randn(50, 7)
    actual = expected + torch.randn(50, 7) * 0.02
    actual[3, 4] = float("nan")
    whole = compare.compare_outputs(actual, expected)
    ref64 = expected.double() * 1.001
    l2 = precision.relative_l2_error(actual.nan_to_num(), ref64)
    monkeypatch.setattr(compare, "CHUNK", 16)
    chunked = compare.compare_outputs(actual, expected)
    assert chunked.table() == whole.table()
    assert chunked.leaves[0].worst.index == whole.leaves[0].worst.index == (3, 4)
    assert precision.relative_l2_error(actual.nan_to_num(), ref64) == pytest.approx(l2, rel=1e-12)
