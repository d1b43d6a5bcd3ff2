"""Value families: the inputs they draw, how a family case is judged, and two kernels right only on model.py's values (a softmax without the row max, a loss on a subsample) failing by name."""

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from doubles import LocalCandidate
from support import junit_cases, run_python
from pytest_cudaopt.correctness import compare, values
from pytest_cudaopt.correctness.precision import Precision, precision_tier
from pytest_cudaopt.launch import plugin_args


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 64, generator=g), torch.randint(0, 5, (8,), generator=g),
            torch.rand(8, 64, generator=g) > 0.5, torch.rand(8, 64, generator=g)]


@pytest.mark.parametrize("family", values.FAMILIES)
def test_a_family_changes_the_float_inputs_alone_and_replays_from_its_seed(family):
    inputs = _inputs()
    first, applied = values.apply(family, inputs, seed=11, names=["x", "index", "mask", "t"])
    again, _ = values.apply(family, inputs, seed=11)
    other, _ = values.apply(family, inputs, seed=12)
    assert torch.equal(first[1], inputs[1]) and torch.equal(first[2], inputs[2])  # int and bool kept
    changed = [i for i in (0, 3) if not torch.equal(first[i], inputs[i])]
    assert changed == ([applied.spiked] if family == "spikes" else [0, 3])
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert any(not torch.equal(a, b) for a, b in zip(first, other))
    assert all(bool(torch.isfinite(x).all()) for x in first if x.is_floating_point())
    assert applied.describe().startswith(f"values: {family} (")


def test_spikes_change_a_few_elements_by_a_lot_and_restore_gives_the_model_values_back():
    inputs = _inputs()
    spiked, applied = values.apply("spikes", inputs, seed=3, names=["x", "index", "mask", "t"])
    i = applied.spiked
    differs = (spiked[i] != inputs[i]).sum().item()
    assert 1 <= differs <= values.SPIKES and differs == len(applied.spikes)
    rms = inputs[i].pow(2).mean().sqrt().item()
    assert all(abs(after - before) >= 100 * rms for _, before, after in applied.spikes)
    assert torch.equal(applied.restore(spiked)[i], inputs[i])
    assert f"input {i} (" in applied.describe()


def test_heavy_tails_keep_the_sign_of_nonnegative_inputs_and_reach_far():
    t = torch.rand(256, 256)
    [heavy], _ = values.apply("heavy", [t], seed=5)
    assert bool((heavy >= 0).all()) and heavy.max().item() > 100 * t.max().item()


def test_the_output_scale_is_the_upper_quartile_of_the_finite_magnitudes_of_every_float_output():
    a = torch.tensor([[1.0, -2.0], [3.0, float("inf")]])
    b = torch.tensor([-4.0, float("nan"), 5.0], dtype=torch.float64)
    expected = float(torch.quantile(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64), 0.75))
    assert values.output_scale((a, {"b": b, "n": torch.arange(9)})) == expected == 4.0
    assert values.output_scale(torch.zeros(4) + torch.tensor([0, 0, 0, 2.0])) == 0.5   # the quartile is 0: the mean
    assert values.output_scale((torch.arange(3), 7)) == 1.0                            # no float output


def test_the_setting_names_families_and_rejects_unknown_ones():
    assert values.parse("all") == values.FAMILIES and values.parse("none") == ()
    assert values.parse("small, spikes") == ("spikes", "small")
    with pytest.raises(ValueError, match="some of spikes, heavy"):
        values.parse("spikes,tails")
    assert values.split_case("batch_size=3,values=heavy") == ("batch_size=3", "heavy")
    assert values.split_case("batch_size=3") == ("batch_size=3", values.MODEL)
    assert [values.canonical_family(k, values.FAMILIES) for k in range(3)] == ["model", "spikes", "heavy"]


def test_a_family_is_skipped_where_the_float64_reference_or_float32_range_gives_out():
    finite = torch.tensor([1.0, 2.0])
    assert values.not_finite(finite, finite.double()) == ""
    assert "float64 reference is not finite at 1 of 2" in values.not_finite(
        finite, torch.tensor([1.0, math.inf], dtype=torch.float64))
    assert "float32 reference overflows at 1 of 2" in values.not_finite(
        torch.tensor([1.0, math.inf]), torch.tensor([1.0, 1e300], dtype=torch.float64))


def test_an_allowance_widens_the_element_wise_tolerance_where_it_is_given():
    expected = torch.tensor([1.05, 100.0])
    actual = torch.tensor([1.1, 100.0])            # 5% off at [0]
    assert not compare.compare_outputs(actual, expected, atol=0.0, rtol=1e-2).passed
    allowance = {"output": torch.tensor([0.5, 0.0])}
    assert compare.compare_outputs(actual, expected, atol=0.0, rtol=1e-2, allowance=allowance).passed
    assert not compare.compare_outputs(torch.tensor([1.05, 110.0]), expected, atol=0.0, rtol=1e-2,
                                       allowance=allowance).passed


class _Attention(torch.nn.Module):
    """softmax(q k^T) v with q = k = v = x @ w: a spike in x makes a row of scores one-hot."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 32) / 32)

    def forward(self, x, rounding=None):
        r = rounding or (lambda t: t)
        q = r(x) @ r(self.w)
        return torch.softmax(r(q) @ r(q).transpose(-1, -2), dim=-1) @ r(q)


class _Rounded(torch.nn.Module):
    """The attention at TF32: the kernel the family judge sees."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, _tf32)


def _tf32(t: torch.Tensor) -> torch.Tensor:
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).to(t.dtype)


@pytest.mark.parametrize("family", values.ALL)
def test_a_tf32_kernel_passes_every_family_where_the_values_leave_attention_ill_conditioned(family):
    from pytest_cudaopt.correctness import family as family_case, guards

    torch.manual_seed(0)
    model = _Attention().eval()
    base = [torch.randn(4, 64, 32)]
    with torch.no_grad():
        inputs, applied = values.apply(family, base, seed=5, names=["x"])
        if family not in (values.MODEL, "spikes"):
            applied.base_scale = values.output_scale(model(*base))
        expected = model(*inputs)
        trial = guards.Trial(model=model, model_new=LocalCandidate(_Rounded(model)), model64=None, workdir=Path("."),
                             device=torch.device("cpu"), atol=1e-2, rtol=1e-2, input_names=["x"])
        _, precision = family_case.judge(applied, trial, inputs, model(inputs[0], _tf32), expected)
        assert precision.tier == "tf32-like", precision.describe()
        # ... while an answer off by 30% fails on every family (a mismatch, or a wrong tier the guards fail)
        try:
            _, off = family_case.judge(applied, trial, inputs, expected * 1.3, expected)
        except guards.GuardFailure:
            off = None
        assert off is None or off.tier == "wrong", off.describe()


def test_the_bound_on_ill_conditioned_values_grows_with_their_rounding_not_past_ten_times():
    """The H200's default workdir on spikes: the float32 reference 74x its usual error, rounding the
    inputs at bfloat16 moves the output 5.2%. The bound is twice that, not 0.74: an answer 30% off fails."""
    from pytest_cudaopt.correctness.precision import error_bound

    assert error_bound(1e-2, 7.4e-6, conditioned=True, sensitivity=0.052) == pytest.approx(0.104)
    assert error_bound(1e-2, 7.4e-6, conditioned=True) == pytest.approx(0.1)
    assert error_bound(1e-2, 3e-7, conditioned=True) == pytest.approx(0.03)   # 3x its usual: 3x the bound


def test_an_output_of_another_layout_than_the_reference_fails_saying_strides():
    e = torch.arange(12.0).reshape(3, 4)
    a = torch.empty(4, 3).t()  # (3, 4), column-major
    a.copy_(e)
    assert torch.equal(a, e)
    result = compare.compare_outputs(a, e)
    assert not result.passed and "strides differ: candidate (1, 3), reference (4, 1)" in result.reason


def test_a_tf32_precise_candidate_keeps_its_tier_where_the_family_leaves_the_reference_imprecise():
    # On model.py's values the float32 reference is 1e-7 off and TF32 3e-4: tf32-like. On values
    # where the float32 reference is 100x further off (1e-5), TF32 is too: still tf32-like; and
    # where rounding the inputs at bfloat16's precision moves the output by 20%, 5% is TF32's.
    assert precision_tier(3e-4, 1e-7) == precision_tier(3e-2, 1e-5, conditioned=True) == "tf32-like"
    assert precision_tier(5e-2, 1e-7, conditioned=True, sensitivity=0.2) == "tf32-like"
    assert precision_tier(3e-2, 1e-5) == "half-like"
    # ... while the same error on well-conditioned values is half-like, and past the bound wrong.
    assert precision_tier(3e-2, 1e-7, conditioned=True) == "half-like"
    assert Precision.measure(torch.tensor([1.3]), torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64),
                             max_rel_error=1e-2, conditioned=True).tier == "wrong"


def _p(candidate: float, reference: float, tier: str) -> Precision:
    return Precision(candidate, reference, tier)


def test_an_error_that_grows_with_the_values_fails_naming_the_family_and_both_values():
    seen: dict = {}
    values.record(seen, "model", _p(2e-7, 1e-7, "fp32"), "drawn shape n=3")
    values.record(seen, "large", _p(3e-7, 1e-7, "fp32"), "drawn shape n=5")
    assert values.grown(seen) == ""
    values.record(seen, "heavy", _p(4e-3, 1e-7, "half-like"),
                  "drawn shape n=7, worst at output[2]: actual 9, expected 8")
    text = values.grown(seen)
    assert "error grows with the input values" in text
    assert "values heavy: half-like" in text and "worst at output[2]: actual 9, expected 8" in text
    # A kernel that is half-like on model.py's values too has a tier, not a growing error.
    seen2: dict = {}
    values.record(seen2, "model", _p(3e-3, 1e-7, "half-like"), "a")
    values.record(seen2, "heavy", _p(4e-3, 1e-7, "half-like"), "b")
    assert values.grown(seen2) == ""


def test_a_skipped_family_is_recorded_with_its_reason_and_counted_on_model_values():
    seen: dict = {}
    values.record(seen, "large", _p(1e-7, 1e-7, "fp32"), "c", skipped="the float32 reference overflows")
    assert seen["large"].to_json() == {"cases": 0, "tier": None, "skipped": 1,
                                       "why": "the float32 reference overflows"}
    assert seen["model"].cases == 1


# -- the two cheats and their honest twins, end to end ------------------------------------------------

# name -> (model.py from variants/, model_new.py from variants/)
JUDGED = {"softmax": (None, None), "softmax_no_max": (None, "softmax_no_max.py"),
          "mse": ("mse/model.py", "mse/honest.py"), "mse_strided": ("mse/model.py", "mse/strided.py")}
CANONICAL = ("test_canonical[seed0]", "test_canonical[seed1]", "test_canonical[seed2]")


@pytest.fixture(scope="module")
def judged(prebuilt_workdir, tmp_path_factory):
    """One `pytest -m correctness` session over the JUDGED copies of cpu_values."""
    root = tmp_path_factory.mktemp("values")
    src = prebuilt_workdir("cpu_values")
    for name, (model, model_new) in JUDGED.items():
        dest = root / name
        shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        for rel, target in ((model, "model.py"), (model_new, "model_new.py")):
            if rel:
                shutil.copyfile(dest / "variants" / rel, dest / target)
    (root / "pytest.ini").write_text("[pytest]\ncudaopt_device = cpu\n")
    cmd = ["-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly", "-m", "correctness",
           "--cudaopt-seed=20261204", f"--junitxml={root / 'junit.xml'}", f"--cudaopt-report={root / 'report.json'}",
           *[f"{name}/model_new.py" for name in JUDGED]]
    done = run_python(cmd, cwd=root, timeout=900)
    assert (root / "junit.xml").is_file(), done.stdout + done.stderr
    return root, junit_cases(root / "junit.xml"), json.loads((root / "report.json").read_text())


@pytest.mark.parametrize("workdir", ["softmax", "mse"])
def test_the_honest_softmax_and_loss_pass_every_family(judged, workdir):
    _, cases, report = judged
    for test in (*CANONICAL, "test_drawn_shapes"):
        outcome, text = cases[(workdir, test)]
        assert outcome == "passed", text
    drawn = [r["data"] for r in report["results"]
             if Path(r["data"]["workdir"]).name == workdir and r["data"]["case"].startswith("drawn")]
    families = drawn[0]["values"]
    assert set(families) >= {"model", "spikes", "heavy"} and all(
        entry["tier"] == "fp32" for entry in families.values() if entry["cases"]), families


def test_a_softmax_without_the_row_max_fails_on_large_values_naming_the_family(judged):
    _, cases, _ = judged
    assert cases[("softmax_no_max", "test_canonical[seed0]")][0] == "passed"   # exact on randn
    for test in ("test_canonical[seed1]", "test_canonical[seed2]", "test_drawn_shapes"):
        outcome, text = cases[("softmax_no_max", test)]
        assert outcome == "failed", text
        assert "NaN where the other is not" in text and "values: " in text, text
        assert "expected" in text and "actual            nan" in text, text


def test_a_loss_over_every_64th_element_fails_naming_the_input_and_elements_it_ignores(judged):
    _, cases, _ = judged
    outcome, text = cases[("mse_strided", "test_canonical[seed1]")]
    assert outcome == "failed", text
    assert "values: spikes (a few elements of one input changed by a lot); input " in text
    assert "every input element must be able to move the output: changing input " in text
    assert "ModelNew's did not move" in text or "ModelNew's moved differently" in text
    outcome, text = cases[("mse_strided", "test_canonical[seed2]")]
    assert outcome == "failed" and "values: heavy" in text, text
    assert cases[("mse_strided", "test_drawn_shapes")][0] == "failed"


def test_a_failed_family_case_replays_from_its_printed_command(judged):
    root, cases, _ = judged
    text = cases[("mse_strided", "test_drawn_shapes")][1]
    [replay] = [line.removeprefix("replay: ") for line in text.splitlines() if line.startswith("replay: pytest")]
    assert ",values=" in replay, replay
    import shlex

    args = shlex.split(replay)[1:]
    family = replay.split(",values=")[1].split()[0].strip("'")
    done = run_python(["-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly", *args],
                      cwd=root, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"values: {family}" in done.stdout, done.stdout


def test_a_drawn_shape_costs_one_case_whatever_families_are_drawn_with_it():
    from types import SimpleNamespace

    from pytest_cudaopt.correctness import verdict

    class Recording(verdict._DrawnShapes):
        def _judge(self, constants, family):
            calls.append((constants["n"], family))
            if constants["n"] == 64 and family == "model":
                raise AssertionError("wrong at 64")

    calls: list = []
    settings = SimpleNamespace(case="n=16")  # no explicit cases to find: no reference needed
    drawn = Recording(SimpleNamespace(reference=None), settings, SimpleNamespace(seed=1), "t",
                      SimpleNamespace(defaults={"n": 8}))
    settings.case = None
    for n, family in [(16, "model"), (16, "heavy"), (16, "spikes"), (8, "heavy"), (32, "heavy"), (32, "model")]:
        drawn.judge({"n": n}, family)
    assert calls == [(16, "model"), (32, "heavy")]  # the canonical 8 is the canonical items'
    with pytest.raises(AssertionError):
        drawn.judge({"n": 64}, "model")
    drawn.judge({"n": 64}, "heavy")  # a shape that failed is judged on another family
    assert calls[-2:] == [(64, "model"), (64, "heavy")]


def test_restricting_the_families_is_a_relaxation_and_lets_a_bounded_input_kernel_pass(judged):
    root, _, _ = judged
    done = run_python(["-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly",
                       "softmax_no_max/model_new.py::TestCorrectness::test_canonical", "--cudaopt-values=small",
                       f"--cudaopt-report={root / 'relaxed.json'}", "-q"], cwd=root, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    relaxations = json.loads((root / "relaxed.json").read_text())["relaxations"]
    assert any("values small (value families not judged: spikes, heavy, large, shifted)" in r
               for r in relaxations), relaxations
