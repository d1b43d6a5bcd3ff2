"""The correctness verdict on outputs allclose cannot judge: fills of tiny outputs, integer outputs, buffers, canonical-only candidates, empty inputs, a get_inputs() that yields no case."""

import re
import textwrap

import pytest

from support import run_pytest, run_python

SOFTMAX = """
import torch
import torch.nn as nn

batch_size = 16
dim = 4096
CUDAOPT_SHAPES = {}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
"""

FILL = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {fill}
"""


def _workdir(make_workdir, tmp_path, model: str, model_new: str):
    root = make_workdir("cpu_scale", tmp_path / "wd")
    (root / "model.py").write_text(textwrap.dedent(model))
    (root / "model_new.py").write_text(textwrap.dedent(model_new))
    return root


@pytest.mark.parametrize("fill", ["torch.full_like(x, 1.0 / x.shape[1])", "torch.zeros_like(x)"])
def test_a_fill_of_tiny_outputs_fails_as_wrong_even_with_no_drawn_shapes(pytester, make_workdir, fill):
    root = _workdir(make_workdir, pytester.path, SOFTMAX, FILL.format(fill=fill))
    result = run_pytest(pytester, str(root / "model_new.py"), "-m", "correctness",
                        "--cudaopt-device=cpu", "--cudaopt-seeds=1", "-rs")
    text = result.stdout.str()
    result.assert_outcomes(failed=1, skipped=1)
    assert "FAIL (wrong)" in text
    assert "relative L2 error vs the float64 reference" in text
    assert "atol 0.01 >= max|expected|" in text


INT_MODEL = """
import torch
import torch.nn as nn

n = 64
CUDAOPT_SHAPES = {}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.randint(0, 100, (n,)), persistent=False)

    def forward(self, x):
        return x * 3 + self.offset


def get_inputs():
    return [torch.randint(1000, 2000, (n,))]


def get_init_inputs():
    return []
"""

INT_NEW = """
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.randint(0, 100, (64,)), persistent=False)

    def forward(self, x):
        return {body}
"""


@pytest.mark.parametrize("body, passed", [("torch.addcmul(self.offset, x, torch.full_like(x, 3))", True),
                                          ("torch.addcmul(self.offset + 1, x, torch.full_like(x, 3))", False)])
def test_integer_outputs_are_exact_and_buffers_start_equal(pytester, make_workdir, body, passed):
    root = _workdir(make_workdir, pytester.path, INT_MODEL, INT_NEW.format(body=body))
    result = run_pytest(pytester, str(root / "model_new.py"), "-m", "correctness", "--cudaopt-device=cpu",
                        "--cudaopt-seeds=1", "--cudaopt-allow-ops=aten::addcmul,aten::add", "-rs")
    text = result.stdout.str()
    if passed:
        result.assert_outcomes(passed=1, skipped=1)
        assert " exact " in text or "exact |" in text or "exact\n" in text
    else:
        result.assert_outcomes(failed=1, skipped=1)
        assert "exact equality (integer/bool output)" in text


CANONICAL_ONLY = """
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    # Like a kernel launched on a fixed grid sized for the canonical (16, 64) input: the
    # rows and features past it are never written.
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        if x.shape[0] > 16 or x.shape[1] > 64:
            return torch.zeros_like(x)
        return cuda_extension.scale(x, self.weight, self.bias)
"""


def test_a_candidate_correct_only_up_to_the_canonical_size_fails_in_ci_with_every_seed(pytester, make_workdir):
    root = make_workdir("cpu_scale", pytester.path / "wd")
    (root / "model_new.py").write_text(CANONICAL_ONLY)
    for seed in (1, 2, 3):
        result = run_pytest(pytester, str(root / "model_new.py"), "-m", "correctness", "--cudaopt-device=cpu",
                            "--cudaopt-seeds=1", f"--cudaopt-seed={seed}", "--cudaopt-profile=ci",
                            "--cudaopt-max-examples=1")
        text = result.stdout.str()
        result.assert_outcomes(passed=1, failed=1)
        assert re.search(r"^FAILED .*model_new\.py::TestCorrectness::test_drawn_shapes\b", text, re.M), text[-3000:]
        assert "batch_size=17" in text or "features=65" in text, text[-3000:]


FEW_MODEL = """
import torch
import torch.nn as nn

n = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if x.shape[0] not in (1, 64, 65):
            raise ValueError("only 1, 64 or 65 rows")
        return x * 0


def get_inputs():
    return [torch.randn(n, 8)]


def get_init_inputs():
    return []
"""

FEW_NEW = FILL.format(fill="torch.zeros_like(x)")


def test_an_item_with_fewer_than_a_handful_of_valid_shapes_says_so(pytester, make_workdir):
    root = _workdir(make_workdir, pytester.path, FEW_MODEL, FEW_NEW)
    result = run_pytest(pytester, str(root / "model_new.py"), "-m", "correctness", "--cudaopt-device=cpu",
                        "--cudaopt-seeds=1", "--cudaopt-max-examples=10")
    text = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert "FAIL (few shapes)" in text
    assert "only 2 distinct valid shapes besides the canonical one" in text
    assert "CUDAOPT_SHAPES" in text


SCALE_MODEL = """
import torch
import torch.nn as nn

batch_size = {batch}
features = 64


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x * self.weight + self.bias


def get_inputs():
    {get_inputs}


def get_init_inputs():
    {init}
"""
NO_CASE = {
    "empty": (0, "return [torch.randn(batch_size, features)]"),
    "bare": (16, "return torch.randn(batch_size, features)"),
    "raises": (16, "raise ValueError('no inputs here')"),
    # an init argument the worker's reader refuses: numpy's int, which Model itself takes
    "numpy_init": (16, "return [torch.randn(batch_size, features)]",
                   "import numpy\n    return [numpy.int64(features)]"),
}


@pytest.fixture(scope="module")
def no_case(prebuilt_workdir, tmp_path_factory):
    """One `pytest -m correctness` session over cpu_scale copies whose model.py has a size-0
    batch, a get_inputs() that returns a bare tensor, one that raises: junit cases."""
    import shutil
    import sys

    from support import junit_cases

    from pytest_cudaopt.launch import plugin_args

    root = tmp_path_factory.mktemp("no_case")
    for name, (batch, body, *init) in NO_CASE.items():
        shutil.copytree(prebuilt_workdir("cpu_scale"), root / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        (root / name / "model.py").write_text(SCALE_MODEL.format(batch=batch, get_inputs=body,
                                                                 init=init[0] if init else "return [features]"))
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-m", "correctness",
           "--cudaopt-device=cpu", "--cudaopt-seeds=1", f"--junitxml={root / 'junit.xml'}",
           *[f"{name}/model_new.py" for name in NO_CASE]]
    done = run_python(cmd[1:], cwd=root, timeout=900)
    assert (root / "junit.xml").is_file(), done.stdout + done.stderr
    return junit_cases(root / "junit.xml")


def test_an_init_argument_the_worker_would_refuse_fails_each_item_naming_it_and_model_py(no_case):
    """Refused before it is sent (the worker lives on): not a dead worker's bare traceback."""
    for test in ("test_canonical[seed0]", "test_drawn_shapes"):
        outcome, text = no_case[("numpy_init", test)]
        assert outcome == "failed", text
        assert "a numpy.int64 (np.int64(64)) from model.py cannot be sent to ModelNew's process" in text, text
        assert "Traceback" not in text and "UnpicklingError" not in text, text


def test_a_size_0_dimension_is_judged_like_any_shape(no_case):
    for test in ("test_canonical[seed0]", "test_drawn_shapes"):
        outcome, text = no_case[("empty", test)]
        assert outcome == "passed", text


@pytest.mark.parametrize("name, why", [
    ("bare", "model.py: get_inputs() returned a bare tensor float32["),
    ("raises", "ValueError: no inputs here"),
])
def test_a_drawn_shapes_item_that_could_judge_no_case_fails_and_says_why(no_case, name, why):
    assert no_case[(name, "test_canonical[seed0]")][0] == "failed"
    outcome, text = no_case[(name, "test_drawn_shapes")]
    assert outcome == "failed", text
    assert "no drawn shape could be judged (" in text and why in text, text
