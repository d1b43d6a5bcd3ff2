"""The workdirs a judge command names: workdirs themselves, or folders holding them at any depth."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from pytest_cudaopt.judge.copies import SKIPPED


def is_workdir(path: Path) -> bool:
    return (path / "model.py").is_file() and (path / "model_new.py").is_file()


def find_workdirs(paths: Iterable[str | Path]) -> tuple[list[Path], list[tuple[str, str]]]:
    """(workdirs in the order named, each once; (path, why) for each path that names none)."""
    found: list[Path] = []
    problems: list[tuple[str, str]] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            problems.append((str(raw), f"{raw}: no such file or folder"))
            continue
        if path.is_file() and path.name == "model_new.py":
            path = path.parent
        if not path.is_dir():
            problems.append((str(raw), f"{raw} is neither a workdir nor a folder holding workdirs"))
            continue
        inside = _search(path.resolve())
        if not inside:
            problems.append((str(raw), f"{raw} is not a workdir (no model.py and model_new.py) and holds none"))
        found += [w for w in inside if w not in found]
    return found, problems


def _search(root: Path) -> list[Path]:
    if is_workdir(root):
        return [root]
    found = []
    for folder, dirs, _ in os.walk(root):
        here = Path(folder)
        if here != root and is_workdir(here):
            found.append(here)
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED and not d.startswith("."))
    return sorted(found)
