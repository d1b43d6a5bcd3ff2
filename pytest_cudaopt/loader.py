"""Import a built `cuda_extension` under a name of its own, once per state of its .so."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_cudaopt.buildfile import MODULE_NAME
from pytest_cudaopt.diagnostics import BuildError


# so path → ((mtime, size, inode), module): an unchanged build is not imported twice.
_LOADED: dict[Path, tuple[tuple[int, int, int], Any]] = {}
_load_count = 0


def _demangle(text: str) -> str:
    names = re.findall(r"_Z\w+", text)
    if not names or not shutil.which("c++filt"):
        return text
    out = subprocess.run(["c++filt", *names], capture_output=True, text=True).stdout.split("\n")
    for raw, nice in zip(names, out):
        text = text.replace(raw, f"{nice} ({raw})" if nice and nice != raw else raw)
    return text


def load_extension(result):
    """Import the built `cuda_extension` under a name unique to this build (several
    workdirs can be loaded in one process). A rebuilt .so is loaded from a fresh copy,
    since the dynamic loader would hand back the already loaded file of the same path."""
    global _load_count
    import torch  # noqa: F401  (loads libtorch, which the extension links against)

    so = result.so_path
    stat = so.stat()
    ident = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    cached = _LOADED.get(so)
    if cached is not None and cached[0] == ident:
        result.module = cached[1]
        return cached[1]
    _load_count += 1
    path = so
    if cached is not None:
        fresh = result.build_dir / "loaded"
        fresh.mkdir(exist_ok=True)
        path = fresh / f"{MODULE_NAME}.{os.getpid()}.{_load_count}.so"
        shutil.copy2(so, path)
    tag = hashlib.sha256(str(so).encode()).hexdigest()[:12]
    name = f"cudaopt_ext_{tag}_{_load_count}.{MODULE_NAME}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise BuildError(f"cudaopt build: {MODULE_NAME} of {result.workdir} was built but does "
                         f"not import: {_demangle(str(exc))}", [], result.log_path) from None
    sys.modules[name] = module
    _LOADED[so] = (ident, module)
    result.module = module
    return module
