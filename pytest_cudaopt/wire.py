"""The messages between the judging process and a worker: plain data pickled with tensors out of band (CPU tensors copied through a shared-memory arena, CUDA tensors as IPC handles), read back through an allow-list."""

from __future__ import annotations

import io
import math
import mmap
import os
import pickle
import secrets
import sys
import tempfile
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, Callable

ARENA_BYTES = 64 << 20   # each direction's half; larger tensors take torch's shared-memory files
LEAD_S = 500e-6  # the spin before a timed batch on CUDA (perf.clocks.GpuLead); client.HANDOFF_SLACK_S covers it
ALIGN = 64

# torch's reduction of a tensor too large for the arena or on CUDA: the globals it may name.
_TORCH_ALLOWED = {
    "torch.multiprocessing.reductions": {"rebuild_tensor", "rebuild_cuda_tensor", "rebuild_storage_filename",
                                         "rebuild_storage_empty", "rebuild_typed_storage",
                                         "rebuild_typed_storage_child"},
    "torch._utils": {"_rebuild_tensor", "_rebuild_tensor_v2"}, "torch.storage": {"UntypedStorage", "TypedStorage"},
    "torch": {"Tensor", "Size", "device", "UntypedStorage", "TypedStorage"}, "torch._tensor": {"Tensor"}}
_PLAIN_ALLOWED = {"torch": {"Size", "device"}, "collections": {"OrderedDict"}, "builtins": {"complex"}}


class Unsendable(pickle.PicklingError):
    """A message holds what the other process would refuse to read: refused before a byte is sent."""


def setup_sharing() -> None:
    """Tensors that do not fit the arena travel as named shared-memory files: only bytes cross the socket."""
    import torch.multiprocessing as mp

    mp.set_sharing_strategy("file_system")


class Arena:
    """A shared-memory file mapped by both processes: the judge writes the first half, the worker the second."""

    def __init__(self, path: str, size: int, create: bool):
        import torch

        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path, self.size = path, size
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)

    @classmethod
    def create(cls, size: int = 2 * ARENA_BYTES) -> "Arena":
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        return cls(str(Path(folder, f"cudaopt-{secrets.token_hex(8)}")), size, create=True)

    def region(self, writer: str) -> tuple[int, int]:
        half = self.size // 2
        return (0, half) if writer == "judge" else (half, self.size)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _Packer(pickle.Pickler):
    def __init__(self, file, arena: Arena | None, writer: str):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arena = arena
        self.cursor, self.end = arena.region(writer) if arena is not None else (0, 0)
        self.placed: list[tuple[Any, int]] = []

    def persistent_id(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")  # not imported: no tensor (the worker imports it once confined)
        if torch is None or not isinstance(obj, torch.Tensor):
            return None
        if type(obj) is not torch.Tensor:
            raise Unsendable(f"a {type(obj).__module__}.{type(obj).__qualname__}, not a plain torch.Tensor")
        obj = obj.detach()
        nbytes = obj.numel() * obj.element_size()
        start = -(-self.cursor // ALIGN) * ALIGN
        if obj.device.type == "cpu" and self.arena is not None and start + nbytes <= self.end and not obj.is_sparse:
            if nbytes:
                self.arena.bytes[start:start + nbytes].copy_(obj.contiguous().view(-1).view(torch.uint8))
            self.cursor = start + nbytes
            self.placed.append((obj, start))
            return ("arena", start, str(obj.dtype).removeprefix("torch."), tuple(obj.shape))
        return ("torch", bytes(ForkingPickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))

    def reducer_override(self, obj: Any) -> Any:
        """What the reader's allow-list refuses, refused here (plain containers, numbers, strings never get here)."""
        torch, kind = sys.modules.get("torch"), obj if isinstance(obj, type) else type(obj)
        if ((torch is not None and isinstance(obj, torch.dtype))
                or kind.__qualname__ in _PLAIN_ALLOWED.get(kind.__module__, ())):
            return NotImplemented
        text, name = repr(obj), f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise Unsendable(f"a {name} ({text[:40]}{'...' if len(text) > 40 else ''})")


def _rebuild_cuda_unsynced(*args: Any) -> Any:
    """torch's rebuild of a CUDA tensor without its stream's wait on the sender's event (a gated
    batch's outputs: their producer is behind a gate this process opens later; DONE orders them)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if len(args) != 15:
        raise pickle.UnpicklingError("a CUDA tensor reference of an unknown form")
    return rebuild_cuda_tensor(*args[:-1], False)


class _Unpacker(pickle.Unpickler):
    def __init__(self, file, arena: Arena | None, writer: str, allowed: dict, sync_events: bool = True):
        super().__init__(file)
        self.arena = arena
        self.start, self.end = arena.region(writer) if arena is not None else (0, 0)
        self.allowed = allowed
        self.sync_events = sync_events

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if name in self.allowed.get(module, ()):
            if not self.sync_events and (module, name) == ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"):
                return _rebuild_cuda_unsynced
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a message may not name {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        import torch

        if not isinstance(pid, tuple) or not pid:
            raise pickle.UnpicklingError("a malformed tensor reference")
        if pid[0] == "arena" and len(pid) == 4 and self.arena is not None:
            _, start, dtype_name, shape = pid
            dtype = getattr(torch, str(dtype_name), None)
            if not isinstance(dtype, torch.dtype) or not isinstance(start, int) or start % ALIGN \
                    or not all(isinstance(n, int) and n >= 0 for n in shape):
                raise pickle.UnpicklingError("a malformed arena tensor")
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            if start < self.start or start + nbytes > self.end:
                raise pickle.UnpicklingError("an arena tensor outside its sender's region")
            return self.arena.bytes[start:start + nbytes].view(dtype).view(shape)
        if pid[0] == "torch" and len(pid) == 2 and isinstance(pid[1], bytes):
            found = _Unpacker(io.BytesIO(pid[1]), None, "", _TORCH_ALLOWED, self.sync_events).load()
            if type(found) is not torch.Tensor:
                raise pickle.UnpicklingError(f"a tensor reference gave a {type(found).__name__}")
            return found
        raise pickle.UnpicklingError("an unknown tensor reference")


def send(conn: Connection, message: Any, arena: Arena | None = None, writer: str = "judge",
         on_send: Callable[[], None] | None = None) -> list:
    """Send `message` (`on_send` called just before its bytes go out): the (tensor, offset) pairs in the arena."""
    buffer = io.BytesIO()
    packer = _Packer(buffer, arena, writer)
    packer.dump(message)
    data = buffer.getvalue()
    if on_send is not None:
        on_send()
    conn.send_bytes(data)
    return packer.placed


def receive(conn: Connection, arena: Arena | None = None, sender: str = "worker") -> Any:
    """The next message, its tensors in the sender's half of the arena (until its next message) or rebuilt."""
    return receive_bytes(conn.recv_bytes(), arena, sender)


def receive_bytes(data: bytes, arena: Arena | None = None, sender: str = "worker", sync_events: bool = True) -> Any:
    """`receive` on bytes read; `sync_events=False`: CUDA tensors without waiting on the sender's event."""
    return _Unpacker(io.BytesIO(data), arena, sender, _PLAIN_ALLOWED, sync_events).load()

