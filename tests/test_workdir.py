"""workdir.py on small pure-Python workdirs: distinct modules, cuda_extension per workdir, strict state dicts, seeded inputs."""

import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from pytest_cudaopt.workdir import WorkdirError, load_workdir, module_prefix

MODEL = """
import torch
import torch.nn as nn

batch_size = 4
features = 8


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x * self.weight


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
"""

MODEL_NEW = """
import torch
import torch.nn as nn

import cuda_extension

TAG = cuda_extension.TAG


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return cuda_extension.scale(x, self.weight)
"""


def fake_extension(tag: str) -> types.ModuleType:
    """A stand-in for a built cuda_extension: a module with a `scale` function."""
    module = types.ModuleType("cuda_extension")
    module.TAG = tag
    module.scale = lambda x, w: x * w
    return module


def make(tmp_path: Path, name: str, model: str = MODEL, model_new: str = MODEL_NEW) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "model.py").write_text(textwrap.dedent(model))
    (path / "model_new.py").write_text(textwrap.dedent(model_new))
    return path


def test_two_workdirs_load_side_by_side_each_with_its_own_extension(tmp_path):
    a = load_workdir(make(tmp_path, "a"), fake_extension("A"))
    b = load_workdir(make(tmp_path, "b"), fake_extension("B"))
    assert a.candidate.TAG == "A" and b.candidate.TAG == "B"
    assert a.reference is not b.reference
    assert a.reference.__name__ == f"{module_prefix(a.path)}.model"
    assert a.candidate.__name__ == f"{module_prefix(a.path)}.model_new"
    assert module_prefix(a.path) != module_prefix(b.path)
    # The import-time names are put back as they were.
    assert "cuda_extension" not in sys.modules and "model" not in sys.modules


def test_make_models_copies_the_state_dict_and_sets_eval_mode(tmp_path):
    wd = load_workdir(make(tmp_path, "w"), fake_extension("A"))
    model, model_new = wd.make_models("cpu", seed=1)
    assert torch.equal(model.weight, model_new.weight)
    assert not model.training and not model_new.training
    again, _ = wd.make_models("cpu", seed=1)
    other, _ = wd.make_models("cpu", seed=2)
    assert torch.equal(again.weight, model.weight) and not torch.equal(other.weight, model.weight)


def test_inputs_depend_on_the_seed_only_and_leave_the_global_rng_alone(tmp_path):
    wd = load_workdir(make(tmp_path, "w"), fake_extension("A"))
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = wd.inputs(7)
    assert torch.equal(torch.rand(1), expected_next)  # the global generator did not move
    assert torch.equal(wd.inputs(7)[0], first[0])
    assert not torch.equal(wd.inputs(8)[0], first[0])
    assert first[0].shape == (4, 8)


def test_a_state_dict_mismatch_names_missing_and_unexpected_keys_and_the_file(tmp_path):
    renamed = MODEL_NEW.replace("self.weight", "self.scale")
    wd = load_workdir(make(tmp_path, "w", model_new=renamed), fake_extension("A"))
    with pytest.raises(WorkdirError) as info:
        wd.make_models("cpu")
    message = str(info.value)
    assert message.startswith("model_new.py: ModelNew's state_dict keys differ from Model's (model.py)")
    assert "missing (in Model, not in ModelNew): weight" in message
    assert "unexpected (in ModelNew, not in Model): scale" in message


def test_a_state_dict_shape_mismatch_is_reported(tmp_path):
    wrong = MODEL_NEW.replace("torch.randn(features)", "torch.randn(features + 1)")
    wd = load_workdir(make(tmp_path, "w", model_new=wrong), fake_extension("A"))
    with pytest.raises(WorkdirError, match="size mismatch for weight"):
        wd.make_models("cpu")


def test_an_error_while_importing_shows_the_workdir_line_not_the_loader(tmp_path):
    broken = MODEL_NEW.replace("TAG = cuda_extension.TAG", "TAG = cuda_extension.NOPE")
    with pytest.raises(WorkdirError) as info:
        load_workdir(make(tmp_path, "w", model_new=broken), fake_extension("A"))
    message = str(info.value)
    assert "importing" in message and "model_new.py failed" in message
    assert "model_new.py:7 in <module>: TAG = cuda_extension.NOPE" in message
    assert "AttributeError" in message
    assert "importlib" not in message and "workdir.py" not in message


def test_an_error_in_the_constructor_names_the_call_and_the_line(tmp_path):
    broken = MODEL.replace("super().__init__()", "super().__init__()\n        raise ValueError('bad features')")
    wd = load_workdir(make(tmp_path, "w", model=broken), fake_extension("A"))
    with pytest.raises(WorkdirError) as info:
        wd.make_models("cpu")
    message = str(info.value)
    assert message.startswith("model.py: Model(*get_init_inputs()) raised:")
    assert "model.py:12 in __init__: raise ValueError('bad features')" in message


def test_model_new_can_import_helpers_and_the_reference_from_its_workdir(tmp_path):
    uses_model = MODEL_NEW.replace("import cuda_extension", "import cuda_extension\nimport model\nfrom helper import K")
    path = make(tmp_path, "w", model_new=uses_model)
    (path / "helper.py").write_text("K = 3\n")
    wd = load_workdir(path, fake_extension("A"))
    assert wd.candidate.model is wd.reference and wd.candidate.K == 3


def test_a_folder_without_model_py_is_not_a_workdir(tmp_path):
    (tmp_path / "model_new.py").write_text("")
    with pytest.raises(WorkdirError, match="is not a workdir: it has no model.py"):
        load_workdir(tmp_path, None)


def test_the_nondeterministic_declaration_is_read_from_model_new(tmp_path):
    declared = MODEL_NEW + "\nCUDAOPT_NONDETERMINISTIC = True\n"
    assert load_workdir(make(tmp_path, "a", model_new=declared), fake_extension("A")).nondeterministic
    assert not load_workdir(make(tmp_path, "b"), fake_extension("A")).nondeterministic


@pytest.mark.parametrize("function, body, returned", [
    ("get_inputs", "return torch.randn(batch_size, features)", "a bare tensor float32[4, 8]"),
    ("get_inputs", "return None", "NoneType None"),
    ("get_init_inputs", "return features", "int 8"),
    ("get_init_inputs", "return {'features': features}", "dict {'features': 8}"),
])
def test_a_malformed_helper_of_model_py_is_named_in_one_line(tmp_path, function, body, returned):
    original = ("return [torch.randn(batch_size, features)]" if function == "get_inputs"
                else "return [features]")
    wd = load_workdir(make(tmp_path, "w", model=MODEL.replace(original, body)), fake_extension("A"))
    with pytest.raises(WorkdirError) as info:
        wd.inputs(0) if function == "get_inputs" else wd.make_models("cpu")
    message = str(info.value)
    assert message.startswith(f"model.py: {function}() returned {returned}; it must return a list")
    assert "\n" not in message and info.value.file == "model.py"


@pytest.mark.parametrize("file", ["model.py", "model_new.py"])
def test_a_syntax_error_shows_the_offending_line_without_loader_frames(tmp_path, file):
    model, model_new = MODEL, MODEL_NEW
    if file == "model.py":
        model = MODEL.replace("batch_size = 4", "batch_size = = 4")
    else:
        model_new = MODEL_NEW.replace("TAG = cuda_extension.TAG", "TAG = cuda_extension.TAG)")
    with pytest.raises(WorkdirError) as info:
        load_workdir(make(tmp_path, "w", model=model, model_new=model_new), fake_extension("A"))
    message = str(info.value)
    line = "batch_size = = 4" if file == "model.py" else "TAG = cuda_extension.TAG)"
    assert message.startswith(f"{file}:") and "SyntaxError" in message.splitlines()[0]
    assert f"    {line}" in message.splitlines() and "^" in message
    assert "frozen" not in message and "importlib" not in message and info.value.file == file


# -- non-persistent buffers ----------------------------------------------------------------------

class _WithOffset(torch.nn.Module):
    def __init__(self, features: int = 4, name: str = "offset"):
        super().__init__()
        self.register_buffer(name, torch.randn(features), persistent=False)
        self.inner = torch.nn.Module()
        self.inner.register_buffer("scale", torch.randn(features), persistent=False)


def test_non_persistent_buffers_are_copied_like_the_state_dict():
    from support import copy_non_persistent_buffers

    model, model_new = _WithOffset(), _WithOffset()
    assert not torch.equal(model.offset, model_new.offset)
    copy_non_persistent_buffers(model, model_new)
    assert torch.equal(model.offset, model_new.offset)
    assert torch.equal(model.inner.scale, model_new.inner.scale)


def test_a_non_persistent_buffer_missing_from_modelnew_is_named():
    from support import copy_non_persistent_buffers

    with pytest.raises(WorkdirError, match="non-persistent buffer 'offset'.*ModelNew has no buffer"):
        copy_non_persistent_buffers(_WithOffset(), _WithOffset(name="other"))
    with pytest.raises(WorkdirError, match="'offset': .*shape \\(4,\\), ModelNew \\(5,\\)"):
        copy_non_persistent_buffers(_WithOffset(4), _WithOffset(5))


def test_zero_tolerances_are_accepted_settings():
    from pytest_cudaopt.suite import settings

    assert settings.resolve("atol", cli="0") == 0.0
    assert settings.resolve("rtol", env={"CUDAOPT_RTOL": "0"}) == 0.0
    with pytest.raises(settings.SettingError):
        settings.resolve("atol", cli="-1")
    assert settings.resolve("max_rel_error") == 1e-2


def test_a_draw_with_cuda_initialised_seeds_the_cuda_generators(monkeypatch):
    # The GPU branch of the input draw (perf draws its inputs with CUDA already initialised): every
    # call it makes must exist on torch and receive the seed.
    from pytest_cudaopt import workdir

    seeded = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    with workdir._seeded(1234):
        first = torch.rand(3)
    with workdir._seeded(1234):
        assert torch.equal(torch.rand(3), first)
    assert seeded == [1234, 1234]


def test_a_draw_without_cuda_seeds_torchs_generator_as_manual_seed_does_and_queues_no_cuda_seed(monkeypatch):
    # torch.manual_seed queues CUDA's seed with its caller's stack, 0.4 ms a draw under pytest.
    from pytest_cudaopt import workdir

    torch.manual_seed(99)
    expected = torch.rand(3)
    seeded = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    with workdir._seeded(99):
        assert torch.equal(torch.rand(3), expected)
    assert seeded == []
