"""CUDA faults: which errors leave the context unusable, the probe that tells, and the line of a fault's message that names it."""

from __future__ import annotations

import torch


class CudaFault(Exception):
    """A CUDA error (illegal memory access, launch failure): the CUDA context of this
    process is unusable for every later GPU test."""



class WorkerCrash(CudaFault):
    """The candidate's worker process died during a call (a segfault in the extension, an
    abort): the case that killed it is the one to report, never shrunk or replayed past.
    `words` is the worker's last output."""

    def __init__(self, headline: str, words: str = ""):
        super().__init__(headline)
        self.words = words


_FAULT_MARKERS = ("CUDA error", "illegal memory access", "unspecified launch failure",
                  "device-side assert", "misaligned address", "an illegal instruction",
                  "CUBLAS_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_EXECUTION_FAILED")


def is_cuda_fault(exc: BaseException) -> bool:
    """True for errors that leave the CUDA context unusable (sticky errors)."""
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(exc, accel):
        return True
    if isinstance(exc, CudaFault):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _FAULT_MARKERS)


def context_alive(device: torch.device | str | None = None) -> bool:
    """Probe the CUDA context after an error: synchronise and run a one-element kernel.
    Errors such as "invalid device ordinal" leave the context usable; a sticky fault
    (illegal address, device-side assert) makes the probe fail too."""
    if not torch.cuda.is_available():
        return False
    try:
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        torch.cuda.synchronize(dev)
        probe = torch.ones(1, device=dev)
        probe.add_(1)
        torch.cuda.synchronize(dev)
        return float(probe.item()) == 2.0
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False


def context_lost(exc: BaseException) -> bool:
    """A CUDA error after which the probe fails: the context is unusable for later items."""
    return is_cuda_fault(exc) and not context_alive()


def fault_line(text: str) -> str:
    """The line of a fault's message that names the error. torch follows "CUDA error: an
    illegal memory access was encountered" with advice lines ("Compile with
    `TORCH_USE_CUDA_DSA` ..."), so neither the first nor the last line will do."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return next((line for line in lines if any(marker in line for marker in _FAULT_MARKERS)), lines[-1])
