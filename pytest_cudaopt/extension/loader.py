"""Import a built `cuda_extension` under a name of its own, once per state of its .so; name what it lacks."""

from __future__ import annotations

import re
import shutil
import subprocess

from pytest_cudaopt.extension.buildfile import MODULE_NAME
from pytest_cudaopt.extension.diagnostics import BuildError
from pytest_cudaopt.candidate.load import defined_functions, import_extension, missing_function_message, takes_module


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
    """Import the built `cuda_extension` of `result` (worker.load.import_extension: a name unique
    to this build, a fresh copy of a rebuilt .so); one that does not import is a BuildError."""
    import torch  # noqa: F401  (loads libtorch, which the extension links against)

    try:
        module = import_extension(result.so_path, result.build_dir)
    except ImportError as exc:
        raise BuildError(f"cudaopt build: {MODULE_NAME} of {result.workdir} was built but does "
                         f"not import: {_demangle(str(exc))}", [], result.log_path) from None
    result.module = module
    return module
