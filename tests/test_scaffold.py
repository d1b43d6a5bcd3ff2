"""`cudaopt init`: the new workdir passes `cudaopt check`, mirrors Model, and fails correctness until kernels exist."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pytest_cudaopt import cli, policy
from pytest_cudaopt.commands import scaffold

GALLERY_MODEL = Path(__file__).resolve().parent / "policy_gallery" / "clean" / "model.py"

MLP_MODEL = '''\
"""Reference: a transformer MLP block with its own GELU module (minGPT style)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPANSION = 4
batch_size = 2
n_embd = 32


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def hidden_size(n_embd):
    return EXPANSION * n_embd


class Model(nn.Module):
    def __init__(self, n_embd, dropout=0.0):
        super(Model, self).__init__()
        self.ln = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, hidden_size(n_embd))
        self.c_proj = nn.Linear(hidden_size(n_embd), n_embd)
        self.act = NewGELU()
        self.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.c_proj(self.act(self.c_fc(self.ln(x)))), 0.0)


def get_inputs():
    return [torch.randn(batch_size, 8, n_embd)]


def get_init_inputs():
    return [n_embd]
'''

CONV_MODEL = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1):
        super().__init__()
        self.conv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return [3, 4, 3]
'''


def write_model(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "models" / "model.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def import_file(path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Import `path` as module `name`, with a stand-in `cuda_extension` (nothing is built here)."""
    monkeypatch.setitem(sys.modules, "cuda_extension", types.ModuleType("cuda_extension"))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("source", [GALLERY_MODEL.read_text(), MLP_MODEL, CONV_MODEL], ids=["linear", "mlp", "conv"])
def test_init_creates_a_workdir_that_passes_check(source: str, tmp_path: Path) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, source))
    assert workdir == (tmp_path / "wd").resolve()
    assert [str(v) for v in policy.check_workdir(workdir)] == []
    assert (workdir / "model.py").read_text() == source
    # a starting kernel; none where a convolution asks for cuDNN (CV001), which the README says
    starting = [".gitkeep"] if source is CONV_MODEL else ["starter.cu", "starter_binding.cpp"]
    assert sorted(p.name for p in (workdir / "kernels").iterdir()) == starting
    assert ("rule\n  CV001" in (workdir / "README.md").read_text()) == (source is CONV_MODEL)
    for name in ("binding.cpp", "binding_registry.h", "utils/compile.sh", "utils/verification.py"):
        assert (workdir / name).read_bytes() == (policy.TEMPLATES / name).read_bytes()


def test_the_generated_model_new_mirrors_the_constructor_and_the_state_dict(tmp_path: Path, monkeypatch) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, MLP_MODEL))
    text = (workdir / "model_new.py").read_text()
    assert "class NewGELU(nn.Module)" in text and "EXPANSION = 4" in text and "def hidden_size" in text
    assert "batch_size" not in text and "import torch.nn.functional" not in text and "Model," not in text
    reference = import_file(workdir / "model.py", "scaffold_reference", monkeypatch)
    candidate = import_file(workdir / "model_new.py", "scaffold_candidate", monkeypatch)
    model, model_new = reference.Model(32, dropout=0.1), candidate.ModelNew(32, dropout=0.1)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert shapes == {k: v.shape for k, v in model_new.state_dict().items()}
    model_new.load_state_dict(model.state_dict(), strict=True)
    with pytest.raises(NotImplementedError, match="ModelNew.forward is not implemented yet: write kernels in "
                                                   "kernels/ and call them through cuda_extension"):
        model_new(*reference.get_inputs())


def test_the_generated_forward_keeps_model_forward_parameters(tmp_path: Path) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, MLP_MODEL))
    tree = ast.parse((workdir / "model_new.py").read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    forward = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert ast.unparse(forward.args) == "self, x: torch.Tensor" and ast.unparse(forward.returns) == "torch.Tensor"


def test_init_refuses_to_overwrite_a_workdir(tmp_path: Path) -> None:
    model = write_model(tmp_path, MLP_MODEL)
    workdir = scaffold.init_workdir(tmp_path / "wd", model)
    (workdir / "model_new.py").write_text("# my work\n")
    with pytest.raises(scaffold.ScaffoldError, match="already exists and is not an empty folder"):
        scaffold.init_workdir(workdir, model)
    assert (workdir / "model_new.py").read_text() == "# my work\n"


def test_init_accepts_an_existing_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, MLP_MODEL))
    assert (tmp_path / "wd" / "cudaopt.lock").is_file()


@pytest.mark.parametrize("source, message", [
    ("import torch\n\nclass Net(torch.nn.Module):\n    pass\n", "defines no class Model"),
    ("class Model:\n    def forward(self, x):\n        return x\n", "defines no get_inputs and no get_init_inputs()"),
    ("class Model(:\n", "model.py:1: does not parse"),
    (MLP_MODEL, "is a folder, not a model.py file"),
], ids=["no-Model", "no-get_inputs", "syntax-error", "a-folder"])
def test_init_explains_a_model_it_cannot_use_and_writes_nothing(source: str, message: str, tmp_path: Path) -> None:
    model = write_model(tmp_path, source)
    with pytest.raises(scaffold.ScaffoldError, match=message):
        scaffold.init_workdir(tmp_path / "wd", model.parent if "folder" in message else model)
    assert not (tmp_path / "wd").exists()


def test_cudaopt_init_and_lock_only_from_the_command_line(tmp_path: Path, capsys) -> None:
    model = write_model(tmp_path, MLP_MODEL)
    workdir = tmp_path / "wd"
    assert cli.main(["init", str(workdir), "--model", str(model)]) == 0
    assert f"created workdir {workdir}" in capsys.readouterr().out
    assert cli.main(["init", str(workdir), "--model", str(model)]) == 1
    assert "never overwrites a workdir" in capsys.readouterr().err
    (workdir / "model.py").write_text(MLP_MODEL.replace("batch_size = 2", "batch_size = 4"))
    assert cli.main(["check", str(workdir)]) == 1
    out = capsys.readouterr().out
    assert "model.py:1: PF003: model.py changed since it was recorded" in out
    assert f"the owner records it with `cudaopt init --lock-only {workdir.resolve()}`" in out  # how to relock
    assert cli.main(["init", str(workdir), "--lock-only"]) == 0
    assert cli.main(["check", str(workdir)]) == 0


def test_cudaopt_init_needs_a_model(tmp_path: Path, capsys) -> None:
    assert cli.main(["init", str(tmp_path / "wd")]) == 2
    assert "--model path/to/model.py is required" in capsys.readouterr().err


@pytest.mark.slow
def test_an_initialised_workdir_fails_correctness_with_the_not_implemented_error(
        pytester: pytest.Pytester, run_pytest) -> None:
    scaffold.init_workdir(pytester.path / "wd", GALLERY_MODEL, device="cpu")
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness or policy", "--cudaopt-device=cpu",
                        timeout=900)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = result.parseoutcomes()
    # the starting kernel builds and follows every rule (EX001 included); only correctness fails
    assert outcomes.get("failed", 0) == 4 and outcomes.get("passed", 0) == len(policy.RULE_IDS) + 1, outcomes
    result.stdout.fnmatch_lines(["*ModelNew.forward is not implemented yet: write kernels in kernels/ and call "
                                 "them through cuda_extension*"])


def test_init_for_the_cpu_leaves_a_cpp_starting_kernel_records_the_device_and_needs_no_flag_after(
        tmp_path: Path, capsys) -> None:
    from pytest_cudaopt.suite.settings import workdir_settings

    model = write_model(tmp_path, MLP_MODEL)
    assert cli.main(["init", str(tmp_path / "wd"), "--model", str(model), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "its device, cpu, is recorded in pyproject.toml" in out and " -m correctness`" in out
    workdir = tmp_path / "wd"
    assert 'cudaopt_device = "cpu"' in (workdir / "pyproject.toml").read_text()
    assert workdir_settings(workdir).device == "cpu"   # what check, judge and gate read
    assert sorted(p.name for p in (workdir / "kernels").iterdir()) == ["starter.cpp", "starter_binding.cpp"]
    readme = (workdir / "README.md").read_text()
    assert "`kernels/starter.cpp` and `kernels/starter_binding.cpp`" in readme
    assert "pytest -m correctness" in readme and "cudaopt init --lock-only ." in readme
    assert "--cudaopt-device=cpu" not in readme
    assert [str(v) for v in policy.check_workdir(workdir)] == []
    (workdir / "README.md").write_text("my notes\n")  # not locked
    assert policy.check_workdir(workdir) == []
    gpu = scaffold.init_workdir(tmp_path / "gpu", model)
    gpu_readme = (gpu / "README.md").read_text()
    assert "pytest -m perf" in gpu_readme and "--cudaopt-device" not in gpu_readme


def test_pytest_judges_a_workdir_made_for_the_cpu_on_the_cpu_without_a_flag_which_still_overrides_it(
        pytester: pytest.Pytester, run_pytest, tmp_path: Path) -> None:
    scaffold.init_workdir(pytester.path / "wd", write_model(tmp_path, MLP_MODEL), device="cpu")
    run_pytest(pytester, "wd", "--collect-only").stdout.fnmatch_lines(["cudaopt: seed * device cpu, *"])
    overridden = run_pytest(pytester, "wd", "--collect-only", "--cudaopt-device=cuda")
    overridden.stdout.fnmatch_lines(["cudaopt: seed * device cuda, *"])


@pytest.mark.slow
def test_the_gpu_starting_kernel_builds_and_check_then_runs_every_rule(tmp_path: Path, capsys) -> None:
    from pytest_cudaopt import extension as build

    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, MLP_MODEL))
    build.compile_extension(workdir)  # nvcc for kernels/starter.cu, on a machine without a GPU too
    assert cli.main(["check", str(workdir)]) == 0
    assert f"follows all {policy.rule_count()} rules" in capsys.readouterr().out


# A helper whose forward names `checkpoint` only in a branch that never runs (KernelBench's
# level3 SwinMLP / SwinTransformerV2 do this): Python imports and runs the model.
UNRUN_BRANCH_MODEL = """
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim, use_checkpoint=False):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.use_checkpoint = use_checkpoint

    def forward(self, x):
        if self.use_checkpoint:
            return checkpoint.checkpoint(self.proj, x)
        return self.proj(x)


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.block = Block(dim)

    def forward(self, x):
        return self.block(x)


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return [8]
"""


def test_init_warns_but_accepts_a_name_used_only_in_a_branch_that_never_runs(tmp_path: Path, capsys,
                                                                             monkeypatch) -> None:
    model = write_model(tmp_path, UNRUN_BRANCH_MODEL)
    assert cli.main(["init", str(tmp_path / "wd"), "--model", str(model)]) == 0
    err = capsys.readouterr().err
    assert "cudaopt init: warning: model.py: Model's constructor or methods may use checkpoint" in err
    assert [str(v) for v in policy.check_workdir(tmp_path / "wd")] == []
    candidate = import_file(tmp_path / "wd" / "model_new.py", "scaffold_unrun_branch", monkeypatch)
    assert set(candidate.ModelNew(8).state_dict()) == {"block.proj.weight", "block.proj.bias"}


# KernelBench level 4: the constructor builds a Hugging Face model (never imported here).
THIRD_PARTY_MODEL = """
import torch
from transformers import AutoConfig, AutoModelForCausalLM

model_name = "gpt2"
config = AutoConfig.from_pretrained(model_name)


class Model(torch.nn.Module):
    def __init__(self, model_name, config):
        super().__init__()
        self.model = AutoModelForCausalLM.from_config(config)

    def forward(self, x):
        return self.model(x).logits


def get_inputs():
    return [torch.randint(0, 100, (1, 16))]


def get_init_inputs():
    return [model_name, config]
"""


def test_init_allows_the_third_party_imports_the_constructor_needs(tmp_path: Path) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, THIRD_PARTY_MODEL))
    assert "from transformers import" in (workdir / "model_new.py").read_text()
    assert 'allow-imports = ["transformers"]' in (workdir / "pyproject.toml").read_text()
    violations = [str(v) for v in policy.check_workdir(workdir)]
    if importlib.util.find_spec("transformers") is None:  # MN010 runs model.py: it needs transformers here
        assert violations == ["model.py:3: MN010: importing model.py failed: ModuleNotFoundError: No module named "
                              "'transformers' (in <module>: `from transformers import AutoConfig, "
                              "AutoModelForCausalLM`)"]
    else:
        assert violations == []


# KernelBench level 3 style (ResNet, DenseNet, EfficientNet, ShuffleNet, RegNet): the constructor
# calls helper methods and reads class attributes, through self, cls and the name Model.
HELPERS_MODEL = '''\
import torch
import torch.nn as nn

WIDTH = 2


class Block(nn.Module):
    expansion = 2

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels * self.expansion, 1)

    def forward(self, x):
        return self.conv(x)


def stage_widths(base):
    return [base * WIDTH ** i for i in range(2)]


class Model(nn.Module):
    """Stages from helper methods, a nested class, a property, a classmethod and a staticmethod."""

    expansion = Block.expansion
    depth = 2

    class Config:
        eps = 1e-5

    def __init__(self, channels: int, num_classes: int = 10):
        super(
            Model, self
        ).__init__()
        self.channels = channels
        self.stages = nn.ModuleList(self._make_stage(width) for width in stage_widths(channels))
        self.norm = nn.LayerNorm(self.out_features, eps=Model.Config.eps)
        self.head = Model.make_head(self.out_features, num_classes)
        self.register_buffer("scale", torch.full((1,), type(self).default_scale()))

    def _make_stage(self, width):
        return nn.Sequential(*[Block(width) for _ in range(self.depth)])

    @property
    def out_features(self):
        return stage_widths(self.channels)[-1] * self.expansion

    @classmethod
    def default_scale(cls):
        return 1.0 / cls.depth

    @staticmethod
    def make_head(features, classes):
        return nn.Linear(features, classes)

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return self.head(self.norm(x.mean((2, 3)))) * self.scale

    def evaluation_copy(self):
        def switch():
            return super(Model, self).train(False)
        return switch() if isinstance(self, Model) else None


Model.tag = "helpers"
batch_size = 2


def get_inputs():
    return [torch.randn(batch_size, 4, 8, 8)]


def get_init_inputs():
    return [4]
'''


def test_the_generated_model_new_keeps_class_attributes_and_helper_methods(tmp_path: Path, monkeypatch) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, HELPERS_MODEL))
    assert [str(v) for v in policy.check_workdir(workdir)] == []  # MN010: it constructs
    text = (workdir / "model_new.py").read_text()
    assert "super().__init__()" in text and "super(ModelNew, self).train(False)" in text
    assert "eps=ModelNew.Config.eps" in text and "ModelNew.make_head(" in text and 'ModelNew.tag = "helpers"' in text
    assert "x.mean((2, 3))" not in text and "batch_size" not in text
    reference = import_file(workdir / "model.py", "scaffold_helpers_reference", monkeypatch)
    candidate = import_file(workdir / "model_new.py", "scaffold_helpers_candidate", monkeypatch)
    model, model_new = reference.Model(4), candidate.ModelNew(4)
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in model_new.state_dict().items()}
    model_new.load_state_dict(model.state_dict(), strict=True)
    assert candidate.ModelNew.expansion == 2 and candidate.ModelNew.default_scale() == 0.5
    assert model_new.out_features == 16 and candidate.ModelNew.tag == "helpers"
    assert model_new.train().evaluation_copy() is model_new and not model_new.training
    with pytest.raises(NotImplementedError, match="ModelNew.forward is not implemented yet"):
        model_new(*reference.get_inputs())


def test_the_generated_forward_takes_the_place_of_models_forward(tmp_path: Path) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, HELPERS_MODEL))
    tree = ast.parse((workdir / "model_new.py").read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    names = [getattr(n, "name", None) for n in cls.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert names == ["Config", "__init__", "_make_stage", "out_features", "default_scale", "make_head", "forward",
                     "evaluation_copy"]
    assert ast.get_docstring(cls) == ("Stages from helper methods, a nested class, a property, a classmethod and "
                                      "a staticmethod.")


TABS_MODEL = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
              "\tscale = 3\n\n\tdef __init__(self, n):\n\t\tsuper(Model, self).__init__()\n"
              "\t\tself.fc = nn.Linear(n, n * self.scale)\n\n\tdef forward(self, x):\n\t\treturn self.fc(x)\n\n\n"
              "def get_inputs():\n\treturn [torch.randn(2, 4)]\n\n\ndef get_init_inputs():\n\treturn [4]\n")


def test_a_model_indented_with_tabs_gives_a_model_new_that_constructs(tmp_path: Path) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, TABS_MODEL))
    assert "\tscale = 3\n" in (workdir / "model_new.py").read_text()
    assert [str(v) for v in policy.check_workdir(workdir)] == []


def test_init_writes_a_gitignore_for_build_outputs_and_caches_that_is_not_locked(tmp_path: Path) -> None:
    workdir = scaffold.init_workdir(tmp_path / "wd", write_model(tmp_path, MLP_MODEL))
    assert (workdir / ".gitignore").read_text().split() == [
        "build/", ".benchmarks/", ".hypothesis/", "__pycache__/", ".pytest_cache/"]
    subprocess.run(["git", "init", "-q", str(workdir)], check=True)
    for left_behind in ("build/cudaopt/x/cuda_extension.so", ".benchmarks/Linux/0001.json", ".hypothesis/db/x",
                        "__pycache__/model.cpython.pyc", "kernels/__pycache__/x.pyc", ".pytest_cache/v/x"):
        (workdir / left_behind).parent.mkdir(parents=True, exist_ok=True)
        (workdir / left_behind).write_text("x")
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=workdir, check=True,
                            capture_output=True, text=True).stdout
    assert sorted(line.split()[-1] for line in status.splitlines()) == sorted(
        [".gitignore", "README.md", "binding.cpp", "binding_registry.h", "conftest.py", "cudaopt.lock",
         "kernels/starter.cu", "kernels/starter_binding.cpp", "model.py", "model_new.py", "pyproject.toml",
         *(f"utils/{p.name}" for p in (workdir / "utils").iterdir())])
    lock = (workdir / "cudaopt.lock").read_text()
    assert ".gitignore" not in json.loads(lock)["files"]
    (workdir / ".gitignore").write_text("build/\n*.log\n")  # the owner's own additions move no verdict
    assert [str(v) for v in policy.check_workdir(workdir)] == []
    _, summary = scaffold.adopt_workdir(workdir)
    assert ".gitignore" not in summary and (workdir / "cudaopt.lock").read_text() == lock
