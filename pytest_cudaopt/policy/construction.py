"""MN010: `ModelNew(*get_init_inputs())` constructs without a GPU and its state dict matches Model's.

The other MN rules read model_new.py; this one runs its import and its constructor, so that a
ModelNew that cannot be built (a helper method or class attribute it lacks, a name it never
imports) fails `cudaopt check` and `pytest -m policy`, not only the correctness items. Each
model is built on the meta device first (parameters are created, no memory is filled: a
ResNet-101 takes milliseconds instead of seconds) and on the CPU when that fails (a
constructor that reads a tensor's values, `.item()`, NumPy). No build is needed: without one,
`import cuda_extension` finds a stand-in whose functions raise only when called.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
import types
from pathlib import Path
from typing import Any, Iterator

from pytest_cudaopt.policy.rules import Violation

RULE = "MN010"
# Where each model is built, in turn (benchmarks/sweep_init.py --cpu-only measures the CPU alone).
DEVICES = ("meta", "cpu")
MAX_LISTED = 6
_FRAME = re.compile(r"^  (?P<file>.+?):(?P<line>\d+) in (?P<func>[^:]+?)(?:: (?P<code>.*))?$")
_LOCATED = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+): (?P<rest>.*)$")


class ExtensionNotBuilt(RuntimeError):
    """A function of the stand-in `cuda_extension` was called."""


class _Unbuilt:
    """`cuda_extension.<name>` of the stand-in: may be stored (`self.op = cuda_extension.gelu`),
    raises when called."""

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
    """A `cuda_extension` module for a workdir without a build: every function name exists,
    calling one raises ExtensionNotBuilt."""
    module = types.ModuleType("cuda_extension", "stand-in for a cuda_extension that is not built")

    def __getattr__(name: str) -> _Unbuilt:  # PEP 562: only for names the module lacks
        if name.startswith("__"):
            raise AttributeError(f"module 'cuda_extension' has no attribute '{name}'")
        return _Unbuilt(name)

    module.__getattr__ = __getattr__
    return module


def _model_new_line(workdir: Path) -> int | None:
    """The line of `class ModelNew` in model_new.py, or None when it does not parse or has
    none (MN001 reports that)."""
    try:
        tree = ast.parse((workdir / "model_new.py").read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError):
        return None
    return next((n.lineno for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)


@contextlib.contextmanager
def _modules_restored(prefix: str) -> Iterator[None]:
    """The workdir's modules in sys.modules as they were before the check (a pytest session
    that loads the workdir for its verdicts keeps its own)."""
    saved = {k: v for k, v in sys.modules.items() if k == prefix or k.startswith(prefix + ".")}
    try:
        yield
    finally:
        for name in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _violation(workdir: Path, exc: BaseException, lead: str, file: str, line: int) -> Violation:
    """One line for an exception: path and line of its innermost workdir frame (from
    `user_traceback`), the exception, that line's code and the frames that called it."""
    from pytest_cudaopt.workdir import user_traceback

    text = user_traceback(exc, [workdir]).splitlines()
    frames = [m for m in map(_FRAME.match, text) if m]
    error = " ".join(ln.strip() for ln in text if not _FRAME.match(ln))
    message = f"{lead}: {_shorten(error, 300)}"
    if frames:
        inner = frames[-1]
        file, line = inner["file"], int(inner["line"])
        details = [f"in {inner['func']}" + (f": `{_shorten(inner['code'], 100)}`" if inner["code"] else "")]
        if len(frames) > 1:
            details.append("called from " + ", ".join(f"{f['file']}:{f['line']} in {f['func']}"
                                                      for f in reversed(frames[:-1])))
        message += f" ({'; '.join(details)})"
    return Violation(Path(file).as_posix(), line, RULE, message)


def _load_failure(workdir: Path, exc: Exception, lead: str, line: int) -> Violation:
    """A WorkdirError of loading or of get_init_inputs(): its cause's frames when it has one,
    else its own first line (`model.py:3: SyntaxError: ...`, a get_init_inputs() that returned
    no list)."""
    named = [name for name in ("model.py", "model_new.py") if str(workdir / name) in str(exc)]
    file = getattr(exc, "file", None) or (named[0] if named else "model_new.py")
    if exc.__cause__ is not None:
        return _violation(workdir, exc.__cause__, lead, file, line if file == "model_new.py" else 1)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    located = _LOCATED.match(first)
    if located and (workdir / located["file"]).is_file():
        return Violation(located["file"], int(located["line"]), RULE, f"{lead}: {located['rest']}")
    return Violation(file, line if file == "model_new.py" else 1, RULE, f"{lead}: {first}")


def _build(cls: type, init: list) -> Any:
    """`cls(*init)` on each of DEVICES until one succeeds; the last one's exception is raised
    (a constructor that needs real values fails on meta: the CPU decides)."""
    import torch

    from pytest_cudaopt.workdir import private_rng

    for device in DEVICES[:-1]:
        try:
            with private_rng(0), torch.device(device):
                return cls(*init)
        except (Exception, SystemExit):  # noqa: BLE001
            pass
    with private_rng(0), torch.device(DEVICES[-1]):
        return cls(*init)


def _listed(keys: list[str]) -> str:
    more = f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else ""
    return ", ".join(keys[:MAX_LISTED]) + more


def _state_dict_difference(model: Any, model_new: Any, line: int) -> list[Violation]:
    """MN010 when ModelNew's state_dict has other keys or shapes than Model's (Model's weights
    could not be loaded into it)."""
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in model_new.state_dict().items()}
    parts = []
    missing, unexpected = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    if missing:
        parts.append(f"missing (in Model, not in ModelNew): {_listed(missing)}")
    if unexpected:
        parts.append(f"unexpected (in ModelNew, not in Model): {_listed(unexpected)}")
    shapes = [f"{k} {ours[k]} in Model, {theirs[k]} in ModelNew" for k in ours if k in theirs and ours[k] != theirs[k]]
    if shapes:
        parts.append(f"other shapes: {_listed(shapes)}")
    if not parts:
        return []
    return [Violation("model_new.py", line, RULE, "ModelNew's state_dict differs from Model's (model.py), so "
                                                  "Model's weights cannot be loaded into it: " + "; ".join(parts))]


def _construct(workdir: Path, line: int, extension: Any) -> list[Violation]:
    from pytest_cudaopt.workdir import WorkdirError, load_workdir

    try:
        work = load_workdir(workdir, extension)
    except WorkdirError as exc:
        return [_load_failure(workdir, exc, f"importing {getattr(exc, 'file', None) or 'the workdir'} failed", line)]
    except SystemExit as exc:  # sys.exit() at import would end `cudaopt check` itself
        return [_violation(workdir, exc, "importing the workdir failed", "model_new.py", line)]
    try:
        init = work.init_inputs()
    except WorkdirError as exc:
        return [_load_failure(workdir, exc, "get_init_inputs() failed, so ModelNew cannot be constructed", line)]
    try:
        model_new = _build(work.candidate.ModelNew, init)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the constructor raises is the finding
        return [_violation(workdir, exc, "ModelNew(*get_init_inputs()) fails on the CPU", "model_new.py", line)]
    try:
        model = _build(work.reference.Model, init)
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        return [_violation(workdir, exc, "Model(*get_init_inputs()) fails on the CPU, so ModelNew's state_dict "
                                         "cannot be compared with it", "model.py", 1)]
    return _state_dict_difference(model, model_new, line)


def check_construction(workdir: Path, extension: Any = None) -> list[Violation]:
    """MN010 on the workdir: model_new.py imports, ModelNew(*get_init_inputs()) constructs
    and its state_dict has Model's keys and shapes. `extension` is the workdir's built
    `cuda_extension` when there is one; None gives the stand-in. Nothing is reported when
    model_new.py has no class ModelNew or there is no model.py (other rules say so)."""
    from pytest_cudaopt.workdir import module_prefix

    workdir = Path(workdir).resolve()
    line = _model_new_line(workdir)
    if line is None or not (workdir / "model.py").is_file():
        return []
    with _modules_restored(module_prefix(workdir)):
        return _construct(workdir, line, stand_in_extension() if extension is None else extension)


def check_construction_within(workdir: Path, extension: Any, timeout: float) -> list[Violation]:
    """`check_construction` under the `cudaopt_timeout` watchdog (`cudaopt check`; the pytest
    item has its own): an import or a constructor that never ends is an MN010 violation at the
    workdir line it was stuck on."""
    from pytest_cudaopt.watchdog import HangTimeout, Watchdog

    dog = Watchdog(timeout, "MN010")
    dog.stage = "importing model_new.py and constructing ModelNew"
    try:
        with dog:
            return check_construction(workdir, extension)
    except HangTimeout as exc:
        return [_violation(Path(workdir).resolve(), exc, f"model_new.py's import and ModelNew(*get_init_inputs()) "
                                                         f"did not end within cudaopt_timeout={timeout:g}s",
                           "model_new.py", 1)]
