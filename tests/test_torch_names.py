"""Every `torch.X.Y` the package names exists in the installed torch: the GPU-only branches run on no CPU test, and a misspelt call there (`torch.cuda.manualseed_all`) would fail only on a GPU."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_cudaopt"
# A dotted name after `torch.`, in code and in messages alike (a message points users at real
# functions); a pattern (`torch.set_*`) is not a name.
NAME = re.compile(r"(?<![\w.])torch((?:\.[A-Za-z_]\w*)+)(?![\w*])")


def _exists(parts: list[str]) -> bool:
    owner = torch
    for i, part in enumerate(parts):
        if hasattr(owner, part):
            owner = getattr(owner, part)
            continue
        try:  # a submodule torch does not import by itself
            owner = importlib.import_module("torch." + ".".join(parts[:i + 1]))
        except ImportError:
            return False
    return True


def test_every_torch_name_the_package_uses_exists():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in NAME.finditer(line):
                parts = match.group(1).strip(".").split(".")
                if not _exists(parts) and not parts[-1].startswith("__") and not line.lstrip().startswith("#"):
                    missing.append(f"{path.relative_to(PACKAGE.parent)}:{number}: torch.{'.'.join(parts)}")
    assert not missing, "names torch does not have:\n" + "\n".join(missing)
