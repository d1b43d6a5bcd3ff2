"""How the plugin finds workdirs: a `model_new.py` beside a `model.py` is collected as the verdict suite, with the timing functions bound first."""

from __future__ import annotations

import fnmatch
import importlib
import os
from pathlib import Path

import pytest

SUITE_MODULE = "pytest_cudaopt.suite.items"
# Importing these binds the timing functions that `perf.clocks.tampered()` checks.
TIMING_MODULES = ("pytest_cudaopt.perf.clocks", "pytest_cudaopt.perf.trace")


def bind_timing() -> None:
    """Import the timing engine, which binds time.perf_counter, torch.cuda.synchronize, ...
    as they are now. Called before any workdir code runs: in pytest_configure when the
    command line names a workdir, else when collection finds the first one (a workdir's
    model_new.py is imported only when its items run). Not at the plugin's import, so that
    loading the plugin imports no torch."""
    for name in TIMING_MODULES:
        importlib.import_module(name)


def is_workdir_file(file_path: Path) -> bool:
    return file_path.name == "model_new.py" and (file_path.parent / "model.py").is_file()


def matches_python_files(path: Path, patterns: list[str]) -> bool:
    """Whether pytest's python plugin collects `path` (the `python_files` ini patterns): a
    pattern without a slash matches the file name, one with a slash the end of the path."""
    for pattern in patterns:
        if "/" not in pattern and os.sep not in pattern:
            matched = fnmatch.fnmatch(path.name, pattern)
        else:
            full = pattern if os.path.isabs(pattern) else f"*{os.sep}{pattern}"
            matched = fnmatch.fnmatch(str(path), full)
        if matched:
            return True
    return False


class WorkdirModule(pytest.Module):
    """The suite in `pytest_cudaopt.suite.items`, collected once for each workdir under
    the workdir's `model_new.py` (node ids like `model_new.py::TestCorrectness::...`)."""

    @classmethod
    def from_parent(cls, parent: pytest.Collector, **kwargs) -> "WorkdirModule":
        from pytest_cudaopt import signals

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
