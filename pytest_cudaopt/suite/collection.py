"""How the plugin finds workdirs: a `model_new.py` beside a `model.py` is collected as the verdict suite, with the timing functions bound first."""

from __future__ import annotations

import fnmatch
import importlib
import os
import re
from pathlib import Path

import pytest

SUITE_MODULE = "pytest_cudaopt.suite.items"
# Importing these binds the timing functions that `perf.clocks.tampered()` checks.
TIMING_MODULES = ("pytest_cudaopt.perf.clocks", "pytest_cudaopt.perf.trace")


def bind_timing() -> None:
    """Import the timing engine, which binds time.perf_counter, torch.cuda.synchronize, ... as
    they are now: before any workdir code runs, not at the plugin's import (no torch there)."""
    for name in TIMING_MODULES:
        importlib.import_module(name)


def worker_ahead(config: pytest.Config, device: str) -> bool:
    """Whether to launch the first named workdir's worker at configure time."""
    option = config.option
    if hasattr(config, "workerinput") or getattr(option, "numprocesses", None) or \
            any(getattr(option, name, False) for name in ("collectonly", "help", "version", "showfixtures",
                                                            "show_fixtures_per_test", "markers")):
        return False
    if device.startswith("cuda") and not os.path.exists("/dev/nvidiactl"):
        return False
    markexpr = config.getoption("markexpr", default="") or ""
    gpu = {"gpu"} if device.startswith("cuda") else set()  # the mark their items get on CUDA
    return any(keeps(markexpr, {kind, *gpu}) is not False for kind in ("correctness", "perf"))


def keeps(markexpr: str, marks: set[str]) -> bool | None:
    """Whether `-m markexpr` keeps an item with `marks`; None for an expression this does not read."""
    tokens = re.findall(r"[()]|[^\s()]+", markexpr)
    at = 0

    def take(expected: str | None = None) -> str:
        nonlocal at
        if at >= len(tokens) or (expected and tokens[at] != expected):
            raise ValueError(markexpr)
        at += 1
        return tokens[at - 1]

    def either() -> bool:
        value = both()
        while tokens[at:at + 1] == ["or"]:
            take()
            value = both() or value  # the right side is read whatever the left says
        return value

    def both() -> bool:
        value = single()
        while tokens[at:at + 1] == ["and"]:
            take()
            value = single() and value
        return value

    def single() -> bool:
        token = take()
        if token == "not":
            return not single()
        if token == "(":
            value = either()
            take(")")
            return value
        if token in ("and", "or", ")") or not re.fullmatch(r"[\w.+-]+", token):
            raise ValueError(markexpr)
        return token in marks

    if not tokens:
        return True
    try:
        value = either()
        return value if at == len(tokens) else None
    except ValueError:
        return None


def workdirs_in(args, invocation_dir: Path, rootpath: Path | None = None) -> list[Path]:
    """The workdirs a pytest command line names, and the rootdir when it is one."""
    found = []
    for arg in [*args, *([str(rootpath)] if rootpath is not None else [])]:
        path = Path(invocation_dir, str(arg).split("::")[0])
        folder = path.parent if path.name == "model_new.py" else path
        if (folder / "model.py").is_file() and (folder / "model_new.py").is_file():
            found.append(folder.resolve())
    return list(dict.fromkeys(found))


def is_workdir_file(file_path: Path) -> bool:
    return file_path.name == "model_new.py" and (file_path.parent / "model.py").is_file()


def matches_python_files(path: Path, patterns: list[str]) -> bool:
    """Whether pytest's python plugin collects `path` (the `python_files` ini patterns)."""
    return any(fnmatch.fnmatch(path.name, p) if "/" not in p and os.sep not in p
               else fnmatch.fnmatch(str(path), p if os.path.isabs(p) else f"*{os.sep}{p}") for p in patterns)


class WorkdirModule(pytest.Module):
    """The suite in `pytest_cudaopt.suite.items`, collected under each workdir's `model_new.py`."""

    @classmethod
    def from_parent(cls, parent: pytest.Collector, **kwargs) -> "WorkdirModule":
        from pytest_cudaopt.run import signals

        signals.install()  # a run that finds its workdirs only now
        bind_timing()  # before the suite, and the workdir's code, is imported
        module = super().from_parent(parent, **kwargs)
        module.obj = importlib.import_module(SUITE_MODULE)  # instead of importing model_new.py
        return module

    @property
    def workdir_path(self) -> Path:
        return self.path.parent


def workdir_node(item: pytest.Item) -> WorkdirModule | None:
    return item.getparent(WorkdirModule)
