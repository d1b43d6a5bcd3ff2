"""The facts of MN010 and EX001, as plain data: whether model_new.py imports and ModelNew(*get_init_inputs()) constructs (each model built on the meta device, else the CPU), the state_dict shapes of both models, and the extension functions model_new.py calls that the module lacks; policy/construction.py decides from them."""

from __future__ import annotations

import ast
import contextlib
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import torch

from pytest_cudaopt.candidate.load import WorkdirError, import_candidate, missing_function_message, module_prefix, private_rng, user_traceback

# Where each model is built, in turn (benchmarks/sweep_init.py --cpu-only measures the CPU alone).
DEVICES = ("meta", "cpu")


class ExtensionNotBuilt(RuntimeError):
    """A function of the stand-in `cuda_extension` was called."""


class _Unbuilt:
    """`cuda_extension.<name>` of the stand-in: may be stored, raises when called."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ExtensionNotBuilt(
            f"cuda_extension.{self._name}() was called while the workdir has no build of cuda_extension; "
            "ModelNew's constructor and model_new.py's import must not call the extension (it is "
            "checked without one), or build it first (`cudaopt build`)")

    def __getattr__(self, name: str) -> "_Unbuilt":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unbuilt(f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"<cuda_extension.{self._name} (not built)>"


def stand_in_extension() -> types.ModuleType:
    """A `cuda_extension` module for a workdir without a build: every function exists and raises."""
    module = types.ModuleType("cuda_extension", "stand-in for a cuda_extension that is not built")

    def __getattr__(name: str) -> _Unbuilt:  # PEP 562: only for names the module lacks
        if name.startswith("__"):
            raise AttributeError(f"module 'cuda_extension' has no attribute '{name}'")
        return _Unbuilt(name)

    module.__getattr__ = __getattr__
    return module


@contextlib.contextmanager
def _modules_restored(prefix: str) -> Iterator[None]:
    """The workdir's modules in sys.modules as they were before the check."""
    saved = {k: v for k, v in sys.modules.items() if k == prefix or k.startswith(prefix + ".")}
    try:
        yield
    finally:
        for name in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
            del sys.modules[name]
        sys.modules.update(saved)


def build_model(cls: type, init: list) -> Any:
    """`cls(*init)` on each of DEVICES until one succeeds (a constructor that needs real values fails on meta)."""
    for device in DEVICES:
        try:
            with private_rng(0), torch.device(device):
                return cls(*init)
        except (Exception, SystemExit):  # noqa: BLE001
            if device == DEVICES[-1]:
                raise


def _failure(stage: str, exc: BaseException, workdir: Path) -> dict:
    """What an exception of `stage` says: its file, its text, the workdir's frames of its cause (or itself)."""
    cause = exc.__cause__
    return {"stage": stage, "file": getattr(exc, "file", None), "text": str(exc), "cause": cause is not None,
            "traceback": user_traceback(cause if cause is not None else exc, [workdir])}


def _construct(workdir: Path, extension: Any) -> dict:
    try:
        reference, candidate = import_candidate(workdir, extension)
    except WorkdirError as exc:
        return {"failed": _failure("import", exc, workdir)}
    except SystemExit as exc:  # sys.exit() at import would end the process
        return {"failed": _failure("exit", exc, workdir)}
    try:
        init = reference.get_init_inputs()
    except Exception as exc:  # noqa: BLE001 - model.py's
        return {"failed": _failure("init", exc, workdir)}
    if not isinstance(init, (list, tuple)):
        return {"failed": {"stage": "init", "file": "model.py", "cause": False, "traceback": "",
                           "text": f"model.py: get_init_inputs() returned {type(init).__name__}; it must return a "
                                   f"list of the arguments of Model(...), e.g. `return [x]`"}}
    built = {}
    for stage, cls in (("model_new", candidate.ModelNew), ("model", reference.Model)):
        try:
            built[stage] = build_model(cls, list(init))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the constructor raises is the finding
            return {"failed": _failure(stage, exc, workdir)}
    return {"failed": None, **{stage: {k: tuple(v.shape) for k, v in built[stage].state_dict().items()}
                               for stage in ("model", "model_new")}}


def construction(workdir: Path, extension: Any = None) -> dict | None:
    """MN010's facts: {"line", "failed": None or {"stage", "file", "text", "cause", "traceback"}, "model"/
    "model_new": {key: shape}}; None without class ModelNew or model.py (other rules say so)."""
    workdir = Path(workdir).resolve()
    try:  # the line of `class ModelNew`, else None (MN001 reports that)
        tree = ast.parse((workdir / "model_new.py").read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError):
        return None
    line = next((n.lineno for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if line is None or not (workdir / "model.py").is_file():
        return None
    with _modules_restored(module_prefix(workdir)):
        return {"line": line, **_construct(workdir, stand_in_extension() if extension is None else extension)}


def called_functions(model_new: Path) -> list[tuple[int, str]]:
    """(line, name) of every `cuda_extension.<name>` in model_new.py (import aliases followed)."""
    tree = ast.parse(model_new.read_text(encoding="utf-8"), str(model_new))
    aliases, found = {"cuda_extension"}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "cuda_extension"}
        elif isinstance(node, ast.ImportFrom) and node.module == "cuda_extension":
            found += [(node.lineno, a.name) for a in node.names]
    found += [(node.lineno, node.attr) for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases]
    return sorted(set(found))


def missing_functions(workdir: Path, module: Any) -> list[tuple[int, str, str]]:
    """EX001's facts: (line, name, why it is missing) for each function model_new.py calls that `module` lacks."""
    path = Path(workdir) / "model_new.py"
    if not path.is_file():
        return []
    try:
        calls = called_functions(path)
    except SyntaxError:
        return []  # MN rules report it
    return [(line, name, missing_function_message(module, name)) for line, name in calls if name not in vars(module)]
