"""Model state away from its defaults: what moves and how, which tensor a candidate ignores, and the correctness verdict on CPU workdirs that drop state."""

import json
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from support import junit_cases, run_python

from pytest_cudaopt.correctness import state
from pytest_cudaopt.launch import plugin_args
from pytest_cudaopt.workdir import load_workdir


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 6)
        self.ln = nn.LayerNorm(6)
        self.bn = nn.BatchNorm1d(6)
        self.register_buffer("mask", torch.tril(torch.ones(6, 6)))
        self.register_buffer("inv_freq", torch.arange(6.0))


def test_it_moves_parameters_and_running_statistics_and_leaves_structural_buffers_alone():
    model = Block()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    done = state.perturb(model, seed=7)
    assert [m.name for m in done] == ["proj.weight", "proj.bias", "ln.weight", "ln.bias", "bn.weight", "bn.bias",
                                      "bn.running_mean", "bn.running_var"]
    after = model.state_dict()
    for name in ("mask", "inv_freq", "bn.num_batches_tracked"):
        assert torch.equal(after[name], before[name]), name
    for m in done:
        assert not torch.equal(after[m.name], before[m.name]), m.name


def test_each_tensor_keeps_its_scale_and_sign():
    model = Block()
    model.bn.running_var.fill_(4.0)
    weight = model.proj.weight.detach().clone()
    state.perturb(model, seed=11)
    # Constants move by up to 30% around their value; zeros to within +-0.3; a variance stays positive.
    assert ((model.ln.weight > 0.7) & (model.ln.weight < 1.3)).all()
    assert ((model.bn.running_var > 2.8) & (model.bn.running_var < 5.2)).all()
    assert (model.ln.bias.abs() < 0.3).all() and model.ln.bias.abs().max() > 0
    assert len(set(model.ln.weight.tolist())) == 6   # element by element, not one new constant
    # A random weight: its own values shuffled, each within 20%: same range and signs, other places.
    new = model.proj.weight.detach()
    assert new.abs().max() <= 1.2 * weight.abs().max() and new.abs().min() >= 0.8 * weight.abs().min()
    assert sorted((new > 0).reshape(-1).tolist()) == sorted((weight > 0).reshape(-1).tolist())
    assert not torch.allclose(new, weight, rtol=0.25)


def test_the_same_seed_moves_the_same_way_and_one_tensor_alone_gets_the_value_it_had_among_all():
    a, b, c = Block(), Block(), Block()
    b.load_state_dict(a.state_dict())
    c.load_state_dict(a.state_dict())
    default = {k: v.clone() for k, v in a.state_dict().items()}
    state.perturb(a, seed=3)
    state.perturb(b, seed=3, only={"bn.running_mean"})
    assert torch.equal(b.bn.running_mean, a.bn.running_mean)
    assert torch.equal(b.ln.weight, default["ln.weight"])
    state.perturb(c, seed=4)
    assert not torch.equal(c.bn.running_mean, a.bn.running_mean)


def test_a_model_without_state_moves_nothing_and_says_so():
    assert state.perturb(nn.ReLU(), seed=1) == []
    assert "as initialised" in state.describe([])


LAYER_NORM = '''
import torch
import torch.nn as nn

features = 16


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(4, features)]


def get_init_inputs():
    return [features]
'''

PLAIN_LAYER_NORM = '''
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x):
        return cuda_extension.{op}(x, self.ln)
'''


def _python_workdir(tmp_path: Path, op: str):
    """A workdir whose `cuda_extension` is Python (no build): `plain` drops weight and bias,
    `no_bias` drops only the bias."""
    (tmp_path / "model.py").write_text(LAYER_NORM)
    (tmp_path / "model_new.py").write_text(PLAIN_LAYER_NORM.format(op=op))
    extension = types.SimpleNamespace(
        plain=lambda x, ln: F.layer_norm(x, ln.normalized_shape, eps=ln.eps),
        no_bias=lambda x, ln: F.layer_norm(x, ln.normalized_shape, ln.weight, None, ln.eps))
    return load_workdir(tmp_path, extension)


@pytest.mark.parametrize("op, ignored", [("plain", ["ln.weight", "ln.bias"]), ("no_bias", ["ln.bias"])])
def test_the_diagnosis_names_each_tensor_the_candidate_ignores(tmp_path, op, ignored):
    workdir = _python_workdir(tmp_path, op)
    text = state.diagnose(workdir, torch.device("cpu"), {}, seed=5, atol=1e-2, rtol=1e-2)
    assert text.splitlines()[0] == "at the default state this case passes"
    assert ("ModelNew ignores state the reference uses: "
            + "; ".join(f"output unchanged when `{name}` changes" for name in ignored)) in text


LINEAR = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.constant = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return torch.min(self.linear(x), self.constant) - self.constant


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16]
'''

LINEAR_NEW = '''
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.constant = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return cuda_extension.no_bias(x, self.linear, self.constant)
'''


def test_the_diagnosis_names_a_forgotten_bias_as_it_names_a_constant_though_the_default_state_fails_too(tmp_path):
    # KernelBench level2/68 in small: a bias is random at its default, so the case fails there too.
    (tmp_path / "model.py").write_text(LINEAR)
    (tmp_path / "model_new.py").write_text(LINEAR_NEW)
    extension = types.SimpleNamespace(no_bias=lambda x, lin, c: torch.min(F.linear(x, lin.weight), c) - c)
    workdir = load_workdir(tmp_path, extension)
    text = state.diagnose(workdir, torch.device("cpu"), {}, seed=5, atol=1e-2, rtol=1e-2)
    assert text.splitlines()[0] == "at the default state this case fails too"
    assert "ModelNew ignores state the reference uses: output unchanged when `linear.bias` changes" in text
    assert "`linear.weight`" not in text and "`constant`" not in text   # those it uses


def test_a_large_weight_moves_by_a_rotation_and_an_in_place_jitter_not_a_full_shuffle(monkeypatch):
    monkeypatch.setattr(state, "SHUFFLE_LIMIT", 100)
    monkeypatch.setattr(state, "JITTER_CHUNK", 64)   # the jitter a chunk at a time
    monkeypatch.setattr(torch, "randperm", None)     # no permutation of every element is drawn
    weight = torch.randn(30, 17)
    new = state.moved(weight, constant=False, seed=7)
    assert new.shape == weight.shape and torch.equal(new, state.moved(weight, constant=False, seed=7))
    assert not torch.equal(new, state.moved(weight, constant=False, seed=8))
    flat, moved = weight.reshape(-1), new.reshape(-1)
    offset = next(k for k in range(1, flat.numel()) if torch.allclose(
        (moved / torch.roll(flat, k)), (moved / torch.roll(flat, k)).clamp(0.8, 1.2)))
    ratio = moved / torch.roll(flat, offset)
    assert ratio.min() >= 0.8 - 1e-6 and ratio.max() <= 1.2 + 1e-6   # its own values, each jittered, signs kept
    assert (moved != flat).all()


def test_the_diagnosis_tries_at_most_its_cap_constants_first(tmp_path):
    workdir = _python_workdir(tmp_path, "plain")
    text = state.diagnose(workdir, torch.device("cpu"), {}, seed=5, atol=1e-2, rtol=1e-2, cap=1)
    assert "output unchanged when `ln.weight` changes" in text and "ln.bias" not in text
    assert "(1 more tensors not tried one at a time)" in text


# -- the correctness verdict on workdirs that drop state -------------------------------------------

# (workdir name, problem in tests/workdirs/cpu_problems/variants, model_new variant)
JUDGED = (("ln_cheat", "layer_norm", "ignores_affine"), ("bn_cheat", "batch_norm", "ignores_running_stats"),
          ("causal", "causal", "hard_coded_mask"), ("ln", "layer_norm", None), ("bn", "batch_norm", "honest"))
CANONICAL = ("test_canonical[seed0]", "test_canonical[seed1]")
DRAWN = "test_drawn_shapes"


@pytest.fixture(scope="module")
def judged(prebuilt_workdir, tmp_path_factory):
    """One `pytest -m correctness` session over the JUDGED workdirs: (junit cases, report, output)."""
    import shutil

    root = tmp_path_factory.mktemp("state")
    src = prebuilt_workdir("cpu_problems")
    for name, problem, variant in JUDGED:
        dest = root / name
        shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        if (dest / "variants" / problem / "model.py").is_file():
            shutil.copyfile(dest / "variants" / problem / "model.py", dest / "model.py")
        if variant is not None:
            shutil.copyfile(dest / "variants" / problem / f"{variant}.py", dest / "model_new.py")
    (root / "pytest.ini").write_text("[pytest]\ncudaopt_device = cpu\ncudaopt_seeds = 2\n")
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-m", "correctness",
           f"--junitxml={root / 'junit.xml'}", f"--cudaopt-report={root / 'report.json'}",
           *[f"{name}/model_new.py" for name, _, _ in JUDGED]]
    done = run_python(cmd[1:], cwd=root, timeout=900)
    assert (root / "junit.xml").is_file(), done.stdout + done.stderr
    return junit_cases(root / "junit.xml"), json.loads((root / "report.json").read_text()), done.stdout


def test_seed0_judges_the_default_state_and_the_other_cases_the_moved_one(judged):
    _, report, _ = judged
    states = {(Path(r["data"]["workdir"]).name, r["data"]["case"].split(" (")[0]): r["data"]["state"]
              for r in report["results"]}
    assert states[("ln", "canonical seed0")] == "default"
    assert states[("ln", "canonical seed1")] == "moved"
    assert states[("ln", "drawn shapes")] == "moved"


def test_a_layer_norm_kernel_that_ignores_weight_and_bias_fails_naming_both(judged):
    cases, _, _ = judged
    assert cases[("ln_cheat", "test_canonical[seed0]")][0] == "passed"   # exact at the default state
    for test in (CANONICAL[1], DRAWN):
        outcome, text = cases[("ln_cheat", test)]
        assert outcome == "failed", text
        assert "state: Model's parameters and running statistics moved from their defaults (2: ln.weight, ln.bias)" in text
        assert "at the default state this case passes" in text
        assert ("ModelNew ignores state the reference uses: output unchanged when `ln.weight` changes; "
                "output unchanged when `ln.bias` changes") in text
        assert "replay: pytest " in text and "--cudaopt-seed=" in text


def test_a_batch_norm_kernel_that_ignores_the_running_statistics_fails_naming_them(judged):
    cases, _, _ = judged
    assert cases[("bn_cheat", "test_canonical[seed0]")][0] == "passed"
    for test in (CANONICAL[1], DRAWN):
        outcome, text = cases[("bn_cheat", test)]
        assert outcome == "failed", text
        assert ("output unchanged when `bn.running_mean` changes; output unchanged when `bn.running_var` "
                "changes") in text
        assert "`bn.weight`" not in text and "`bn.bias`" not in text   # those it uses


@pytest.mark.parametrize("workdir", ["causal", "ln", "bn"])
def test_kernels_that_use_the_state_or_hard_code_the_structure_pass(judged, workdir):
    cases, _, _ = judged
    for test in (*CANONICAL, DRAWN):
        outcome, text = cases[(workdir, test)]
        assert outcome == "passed", text
