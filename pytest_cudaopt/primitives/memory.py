"""Memory in proportion to the problem, on a GPU or on the host: what a case may use, what fits, and a clear failure when nothing does."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

GiB = 1 << 30
FACTOR = 4            # a case may use this many times its inputs + outputs ...
OVERHEAD = 2 * GiB    # ... plus this (the CUDA context, workspaces, the extension)


class DoesNotFit(Exception):
    """A problem needs more device memory than is free."""


def gib(n: int | float) -> str:
    return f"{n / GiB:.2f} GiB"


def case_budget(input_bytes: int, output_bytes: int) -> int:
    """The most device memory judging one case may take: FACTOR x (inputs + outputs) + OVERHEAD."""
    return FACTOR * (input_bytes + output_bytes) + OVERHEAD


def largest_case_budget(canonical_bytes: int, canonical_elements: int, max_elements: int | None,
                        work_bytes: int = 0) -> int:
    """The budget of the largest case a correctness run may judge (canonical or drawn); with `work_bytes`, the
    canonical reference's intermediates, those too (grown with the case as its inputs grow)."""
    if canonical_elements <= 0 or not max_elements or max_elements <= canonical_elements:
        return FACTOR * canonical_bytes + work_bytes + OVERHEAD
    return (FACTOR * canonical_bytes + work_bytes) * max_elements // canonical_elements + OVERHEAD


def weights_on_meta(reference: Any) -> int:
    """Bytes of model.py's Model's parameters and buffers, built on the meta device; 0 where it cannot be."""
    try:
        with torch.device("meta"):
            model = reference.Model(*reference.get_init_inputs())
        return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    except Exception:  # noqa: BLE001 - an estimate, never a verdict
        return 0


def free_bytes(device: torch.device | str, need: int = 0) -> int | None:
    """Free memory on `device` as the process can use it; None where it cannot be told. Where the device has less
    than `need` free outside this process's cache, the cache is released first (`make_room`)."""
    device = torch.device(device)
    if device.type == "cpu":
        return host_free_bytes()
    if device.type != "cuda":
        return None
    if need:
        make_room(device, need)
    free, _total = torch.cuda.mem_get_info(device)
    return free + max(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), 0)


def make_room(device: torch.device | str, need: int) -> None:
    """`release` this process's cache where a CUDA device has less than `need` free outside it."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.mem_get_info(device)[0] < need:
        release(device)


def release(device: torch.device | str) -> None:
    """Give this process's cached device memory back to the driver. Only this process can use what torch's cache
    holds, not the candidate's worker, and blocks this process sent over CUDA IPC stay cached until the receiver lets
    them go: a worker's outputs the size of the problem's need them back."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.ipc_collect()
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None   # "max": no limit


# A cgroup's limit and usage: v2 (the unified hierarchy as a container sees it), then v1.
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def host_free_bytes(meminfo: str = "/proc/meminfo", cgroups=CGROUP_FILES) -> int | None:
    """Host memory a new allocation can still get (MemAvailable, or a cgroup's limit); None: unknown."""
    free = None
    try:
        with open(meminfo, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        free = None
    for limit_file, usage_file in cgroups:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < (1 << 60):  # a v1 "no limit" is ~2**63
            left = max(limit - usage, 0)
            free = left if free is None else min(free, left)
            break
    return free


def where(device: torch.device | str | None) -> str:
    """"host memory" for the CPU, "device memory" otherwise: the words of every message here."""
    return "host memory" if device is not None and torch.device(device).type == "cpu" else "device memory"


def allocated(device: torch.device | str | None) -> int:
    """Bytes torch has allocated on `device` now (0 off CUDA)."""
    if device is None or torch.device(device).type != "cuda":
        return 0
    return torch.cuda.memory_allocated(device)


# Peaks being measured now. torch has one peak counter per device: resetting it first folds the
# counter into every active Peak.
_active: list["Peak"] = []


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _fold(device: torch.device, also: "Peak | None" = None) -> None:
    now = torch.cuda.max_memory_allocated(device)
    for peak in [*_active, *([also] if also is not None else [])]:
        if _index(peak.device) == _index(device):
            peak.most = max(peak.most, now)


@dataclass
class Peak:
    """torch's max allocated device memory over a `with` block (None off CUDA); nested Peaks each keep
    their own figure."""

    device: torch.device

    def __enter__(self) -> "Peak":
        self.bytes: int | None = None
        self.most = 0
        self._abandoned = False
        if self.device.type == "cuda":
            _fold(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            _active.append(self)
        return self

    def abandon(self) -> None:
        """No CUDA call at the block's end (the context may be lost); `bytes` stays None."""
        self._abandoned = True

    def __exit__(self, *exc: Any) -> None:
        if self in _active:
            _active.remove(self)
        if self.device.type == "cuda" and not self._abandoned:
            _fold(self.device, also=self)
            self.bytes = self.most


def check_fits(what: str, need: int, free: int | None, lower: str, memory: str = "device memory") -> None:
    """Raise DoesNotFit when `need` bytes exceed `free` (None: not checked)."""
    if free is not None and need > free:
        raise DoesNotFit(f"{what} needs about {gib(need)} of {memory}, only {gib(free)} is free; {lower}")


def sizes(input_bytes: int, output_bytes: int, work_bytes: int = 0) -> str:
    """"inputs 4.00 GiB, outputs 0.00 GiB, the reference's intermediates 8.00 GiB" (the last where there are)."""
    text = f"inputs {gib(input_bytes)}, outputs {gib(output_bytes)}"
    return text + (f", the reference's intermediates {gib(work_bytes)}" if work_bytes else "")


def case_need(input_bytes: int, output_bytes: int, work_bytes: int = 0) -> int:
    """What one correctness case holds at its peak: three input sets, two outputs, the reference's
    intermediates (`work_bytes`, `Intermediates`), OVERHEAD."""
    return 3 * input_bytes + 2 * output_bytes + work_bytes + OVERHEAD


def float64_need(input_bytes: int, output_bytes: int, work_bytes: int = 0) -> int:
    """A float64 run of the reference: its inputs, outputs and intermediates at twice the float32 size."""
    return 2 * (input_bytes + output_bytes + work_bytes)


def float64_fits(input_bytes: int, output_bytes: int, held: int, free: int | None, work_bytes: int = 0) -> bool:
    """Whether a float64 run of the reference, intermediates and all, fits in free memory and, with `held`, the
    case's budget (which counts its inputs and outputs only, as it always has: no float64 run it allowed is lost)."""
    if free is not None and float64_need(input_bytes, output_bytes, work_bytes) > free:
        return False
    return held + float64_need(input_bytes, output_bytes) <= case_budget(input_bytes, output_bytes)


class Intermediates(TorchDispatchMode):
    """The most bytes of tensors that the ops run inside it held at once (`peak`), storages of `known` tensors
    (the inputs, the parameters) left out, a storage counted once however many views it has. On the meta device
    it tells what an eager run of the same code holds beyond its inputs without allocating a byte: a hinge loss
    over a [32768, 32768] input holds two more of that size at once (`1 - p * t`, then the clamp)."""

    def __init__(self, known: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.known = {x.untyped_storage()._cdata for x in known if isinstance(x, torch.Tensor)}
        self.live: dict[int, list[int]] = {}   # storage -> [bytes, tensors referring to it]
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._hold(leaf)
        return out

    def _hold(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.known:
            return
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        weakref.finalize(tensor, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.now -= entry[0]
                del self.live[key]


def cap_max_elements(max_elements: int | None, canonical_elements: int, canonical_bytes: int,
                     free: int | None) -> tuple[int | None, str]:
    """The drawn-shape size cap, shrunk to what `free` memory allows for one case: (cap, note)."""
    if free is None or max_elements is None or canonical_elements <= 0:
        return max_elements, ""
    per_element = canonical_bytes / canonical_elements
    fits = int((free - OVERHEAD) / (FACTOR * per_element)) if free > OVERHEAD else 0
    if fits >= max_elements:
        return max_elements, ""
    cap = max(fits, 1)
    return cap, f"drawn shapes capped at {cap} input elements (not {max_elements}): {gib(free)} free"


BATCH_EXTRA = 8 << 30  # what batches of timed calls may hold beyond the case budget (perf/engine.py)


def perf_input_plan(input_bytes: int, output_bytes: int, free: int | None, contenders: int,
                    max_batch: int = 1) -> tuple[int, bool, int, str]:
    """(contenders per queued pass, one checked output per pass, calls per batch, note) for the
    perf item, inside the case budget (longer batches may take BATCH_EXTRA more) and free memory."""
    if free is None or input_bytes + output_bytes <= 0:
        return contenders, False, max_batch, ""
    limit = min(case_budget(input_bytes, output_bytes), free - OVERHEAD)

    def need(group: int, batch: int, checked: int) -> int:   # every output of the pass kept
        return (2 + group * batch) * input_bytes + (group * batch + checked + 1) * output_bytes

    def one_kept(group: int) -> int:   # one output checked, the unchecked ones dropped at once
        return (2 + group) * input_bytes + 3 * output_bytes

    if need(contenders, 1, contenders) <= limit:
        roomy = min(limit + BATCH_EXTRA, free - OVERHEAD)
        batch = next((b for b in range(max_batch, 1, -1)
                      if need(contenders, b, b + contenders - 1) + b * (input_bytes + output_bytes) <= roomy), 1)
        return contenders, False, batch, ""
    group = next((g for g in range(contenders, 1, -1) if one_kept(g) <= limit), 1)
    smaller = "" if group == contenders else f", and the contenders queued {group} at a time"
    return group, True, 1, (f"one output checked per queued pass{smaller}: the inputs of a pass of every "
                            f"contender with every output checked would not fit the case budget of {gib(limit)}")
