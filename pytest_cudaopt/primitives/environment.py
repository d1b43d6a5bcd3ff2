"""What a run runs on: torch, CUDA and cuDNN versions, the GPU and the build's arch."""

from __future__ import annotations

import contextlib
from typing import Any


def cuda_device_name() -> str | None:
    """Name of the visible CUDA device, or None when there is none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


def device_summary(device: str = "cuda") -> str:
    """Report-header line: torch, CUDA, the GPU, and the build arch on cuda."""
    import torch

    from pytest_cudaopt.extension import resolve_arch

    parts = [f"torch {torch.__version__}", f"CUDA {torch.version.cuda or 'none'}"]
    name = cuda_device_name()
    if name is None:
        parts.append("no CUDA device")
    else:
        major, minor = torch.cuda.get_device_capability()
        parts.append(f"GPU {name} (sm_{major}{minor})")
    if device == "cuda":
        parts.append(f"arch {resolve_arch()}")
    return "cudaopt: " + ", ".join(parts)


def environment() -> dict[str, Any]:
    """torch, CUDA, cuDNN, Python versions and the GPU (name, compute capability)."""
    import platform

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": str(torch.__version__),
                            "cuda": torch.version.cuda, "cudnn": None, "gpu": None, "gpu_capability": None}
    with contextlib.suppress(Exception):
        info["cudnn"] = torch.backends.cudnn.version()
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_capability"] = f"sm_{major}{minor}"
    return info


def pin_worker_to_gpu(worker_id: str) -> int | None:
    """One GPU per pytest-xdist worker: gwN uses device N modulo the visible ones (None: fewer than two)."""
    import torch

    if (not worker_id.startswith("gw") or not worker_id[2:].isdigit() or not torch.cuda.is_available()
            or torch.cuda.device_count() < 2):
        return None
    index = int(worker_id[2:]) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return index
