"""CUDA faults: which errors leave the context unusable, the probe that tells, and the line of a fault's message that names it."""

from __future__ import annotations

from pytest_cudaopt.candidate.observe import FAULT_MARKERS, CudaFault, context_alive, is_cuda_fault  # noqa: F401


class WorkerCrash(CudaFault):
    """The candidate's worker process died during a call; `words` is its last output."""

    def __init__(self, headline: str, words: str = ""):
        super().__init__(headline)
        self.words = words


def context_lost(exc: BaseException) -> bool:
    """A CUDA error after which the probe fails: the context is unusable for later items."""
    return is_cuda_fault(exc) and not context_alive()


def fault_line(text: str) -> str:
    """The line of a fault's message that names the error (torch follows it with advice lines)."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return next((line for line in lines if any(marker in line for marker in FAULT_MARKERS)), lines[-1])
