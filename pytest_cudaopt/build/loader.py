"""Import a built `cuda_extension` under a name of its own, once per state of its .so; name what it lacks."""

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

from pytest_cudaopt.build.buildfile import MODULE_NAME
from pytest_cudaopt.build.diagnostics import BuildError


# so path → ((mtime, size, inode), module): an unchanged build is not imported twice.
_LOADED: dict[Path, tuple[tuple[int, int, int], Any]] = {}
_load_count = 0


def _demangle(text: str) -> str:
    names = re.findall(r"_Z\w+", text)
    if not names or not shutil.which("c++filt"):
        return text
    try:
        out = subprocess.run(["c++filt", *names], capture_output=True, text=True).stdout.split("\n")
    except OSError:  # in the worker's sandbox no program starts: the names stay mangled
        return text
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
    module.__getattr__ = _missing_function(module)  # PEP 562: only for names the module lacks
    sys.modules[name] = module
    _LOADED[so] = (ident, module)
    result.module = module
    return module


def defined_functions(module) -> list[str]:
    """The functions a loaded `cuda_extension` defines, sorted."""
    return sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))


def takes_module(func) -> bool:
    """True for a binding whose pybind11 signature takes a module: a registration function
    (`void register_op(pybind11::module&)`) that was bound as if it were the op."""
    first = (getattr(func, "__doc__", None) or "").split("\n", 1)[0]
    return re.search(r"\((?:\w+: )?(?:module|types\.ModuleType)\)", first) is not None


def missing_function_message(module, name: str) -> str:
    """Why `cuda_extension.<name>` is missing, in the workdir's own terms."""
    defined = defined_functions(module)
    text = f"cuda_extension has no function '{name}'; "
    if not defined:
        return text + ("it defines none: no kernels/*_binding.cpp registers a function with "
                       "REGISTER_BINDING(op, register_op), where register_op calls m.def")
    text += f"it defines {', '.join(defined)}"
    wrong = [n for n in defined if takes_module(getattr(module, n))]
    if wrong:
        text += (f". {', '.join(wrong)} takes a pybind11 module: that looks like a registration function "
                 "passed in the wrong form (the contract is REGISTER_BINDING(op, register_op); with the "
                 "published agent-workdir binding_registry.h or the shipped one, register_op(pybind11::module& m) "
                 f"calls m.def(\"{name}\", ...))")
    return text


def _missing_function(module):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module 'cuda_extension' has no attribute '{name}'")
        raise AttributeError(missing_function_message(module, name))
    return __getattr__
