"""Whether a workdir's canonical case fits this machine's memory, and the constants that shrink it (said by `cudaopt init` and by the first item)."""

from __future__ import annotations

import types
from pathlib import Path

from pytest_cudaopt.primitives import memory
from pytest_cudaopt.correctness import shapes


def shrink_hint(module: types.ModuleType, model_file: Path, workdir: Path) -> str:
    """What to do when the canonical sizes do not fit: model.py's constants and the lock command."""
    from pytest_cudaopt.policy.files import LOCK_COMMAND

    named = ", ".join(f"{k}={v}" for k, v in shapes.infer_constants(module).items()) or "its sizes"
    return (f"the canonical sizes are {model_file.name}'s constants ({named}): shrink them in {model_file}, then "
            f"record the change with `{LOCK_COMMAND.format(workdir=workdir)}`; or judge on a machine with more memory")


def check_new_workdir(workdir: Path, device: str) -> str:
    """Why one correctness case at model.py's own sizes does not fit the free memory of `device`, for a
    workdir `cudaopt init` just made ("" when it fits, or either cannot be told, or model.py does not import)."""
    import importlib.util
    import sys

    import torch

    model_file = Path(workdir) / "model.py"
    name = "cudaopt_init_model"
    try:
        spec = importlib.util.spec_from_file_location(name, model_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        free = memory.free_bytes(device) if device == "cpu" or torch.cuda.is_available() else None
        if free is None:
            return ""
        check = shapes.check_on_meta(module, {})
        need = memory.case_need(check.input_bytes, check.output_bytes, check.work_bytes)
        if not check.valid or need <= free:
            return ""
        return (f"one correctness case at {model_file.name}'s sizes "
                f"({memory.sizes(check.input_bytes, check.output_bytes, check.work_bytes)}) "
                f"needs about {memory.gib(need)} of {memory.where(device)}, only "
                f"{memory.gib(free)} is free; {shrink_hint(module, model_file, Path(workdir))}")
    except Exception:  # noqa: BLE001 - a model that does not import here is the items' to report
        return ""
    finally:
        sys.modules.pop(name, None)
