"""The correctness verdict on outputs allclose cannot judge: fills of tiny outputs, integer outputs, buffers, canonical-only candidates."""

import textwrap

import pytest

from conftest import run_pytest

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
