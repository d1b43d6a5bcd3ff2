"""One change that candidate code made to what the reference and the baselines run, and where it came from."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# The roads, in the order a failure lists them.
ATTRIBUTE, FLAG, IMPORT, DISPATCHER = "attribute", "flag", "import", "dispatcher"
ROADS = (ATTRIBUTE, FLAG, IMPORT, DISPATCHER)


@dataclass
class Change:
    """`road` is one of ROADS; `what` names the attribute, flag or `op / dispatch key`;
    `detail` says what it was and is now; `origin` is where the new thing was defined, as
    found (a file path, `<string>`, a module name), or "". `undo` puts it back, when it can be."""

    road: str
    what: str
    detail: str
    origin: str = ""
    undo: Callable[[], None] | None = None

    def line(self, workdir: Path | None = None) -> str:
        where = shown_origin(self.origin, workdir)
        return f"{self.road} {self.what}: {self.detail}" + (f" ({where})" if where else "")


def shown_origin(origin: str, workdir: Path | None) -> str:
    """`origin` in the workdir's own terms: `model_new.py:12`, `kernels/x_binding.cpp:40`,
    Python run from a string, the extension's module."""
    if not origin:
        return ""
    if origin.startswith("<"):
        return (f"defined in {origin}: Python code without a file of its own (pybind11::exec or eval in "
                "kernels/, exec, eval or compile in model_new.py)")
    if origin.startswith("module "):
        name = origin.removeprefix("module ")
        if name.startswith("cudaopt_ext_"):
            return "a function of cuda_extension (kernels/)"
        return f"from {name}"
    return "defined in " + workdir_path(origin, workdir)


def workdir_path(location: str, workdir: Path | None) -> str:
    """`file:line` relative to the workdir when the file is in it (the build names sources
    relative to its folder: `../../../kernels/x.cpp` is `kernels/x.cpp`), else as given."""
    path, sep, line = location.rpartition(":")
    if not sep or not line.isdigit():
        path, line = location, ""
    shown = path
    if workdir is not None:
        root = Path(workdir).resolve()
        candidate = Path(path)
        try:
            resolved = candidate.resolve() if candidate.is_absolute() else None
        except OSError:
            resolved = None
        if resolved is not None and (resolved == root or root in resolved.parents):
            shown = resolved.relative_to(root).as_posix()
        elif not candidate.is_absolute():
            parts = Path(os.path.normpath(path)).parts
            if "kernels" in parts:
                tail = Path(*parts[len(parts) - 1 - parts[::-1].index("kernels"):])
                if (root / tail).exists():
                    shown = tail.as_posix()
    return f"{shown}:{line}" if line else shown


def origin_of(value: Any) -> str:
    """Where a Python object was defined: `file:line` of a function's code, `<string>:1`, the
    file of a class (of an instance's class), `module <name>` for a builtin, "" when nothing says."""
    func = inspect.unwrap(value) if callable(value) else value
    func = getattr(func, "__func__", func)
    if not (inspect.isroutine(func) or inspect.isclass(func)) and not isinstance(func, type(inspect)):
        func = type(func)  # an instance (an import hook): where its class was defined
    code = getattr(func, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    if inspect.isclass(func):
        try:
            return f"{inspect.getsourcefile(func) or inspect.getfile(func)}"
        except (TypeError, OSError):
            return f"module {getattr(func, '__module__', '') or '?'}"
    module = getattr(func, "__module__", None)
    return f"module {module}" if module else ""


def short(value: Any) -> str:
    """A value as a failure shows it: a repr of at most 80 characters."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises names its type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."
