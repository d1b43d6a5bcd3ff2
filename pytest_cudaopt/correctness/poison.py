"""Poisoned memory for a candidate's call: what torch allocates without initialising reads as NaN, and the CUDA caching allocator's free blocks are overwritten first."""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Iterator

import torch

from pytest_cudaopt import memory


@contextlib.contextmanager
def poisoned_memory(device: torch.device | str) -> Iterator[None]:
    """For the duration, memory that torch allocates without initialising (torch.empty,
    torch::empty in C++) is filled with NaN (integers: their maximum), on CPU and CUDA
    alike; on CUDA the caching allocator's free memory is also overwritten with NaN first.
    An output element the candidate never writes then reads as NaN, not as a stale copy
    of the right answer."""
    import torch.utils.deterministic as det

    device = torch.device(device)
    if device.type == "cuda":
        _poison_cuda_cache(device)
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warn_only: non-deterministic ops would only warn
        _deterministic(True, warn_only=True)
        det.fill_uninitialized_memory = True
        try:
            yield
        finally:
            det.fill_uninitialized_memory = was_fill
            _deterministic(was_on, warn_only=was_warn)


def _deterministic(mode: bool, warn_only: bool) -> None:
    """torch.use_deterministic_algorithms without the import of torch._inductor it makes only to
    set Inductor's own flag (seconds of a correctness session on a CPU machine, for a flag no
    eager call reads); where Inductor is loaded already, its flag follows as torch sets it."""
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def poison_plan(snapshot: list[dict], device_index: int) -> list[int]:
    """Sizes of the inactive (cached, unused) blocks that torch.cuda.memory_snapshot() lists
    for one device, largest first: asking the caching allocator for exactly these sizes
    hands those very blocks back (best fit), so filling them overwrites their old values."""
    sizes = [block["size"] for segment in snapshot if segment.get("device") == device_index
             for block in segment.get("blocks", ()) if block.get("state") == "inactive" and block.get("size", 0) > 0]
    return sorted(sizes, reverse=True)


def _poison_cuda_cache(device: torch.device) -> None:
    """Fill every inactive caching-allocator block with 0xFF bytes (NaN in every floating
    dtype): a block at a time, each request the block's exact size, all held until the
    last is filled so that none is handed out twice."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    held = []
    memory.exclude_from_peak(device)  # the blocks are the cache's already, not the case's working set
    try:
        for size in poison_plan(torch.cuda.memory_snapshot(), index):
            block = torch.empty(size, dtype=torch.uint8, device=device)
            block.fill_(0xFF)
            held.append(block)
    except torch.OutOfMemoryError:
        pass
    finally:
        del held
        memory.resume_peak(device)
