"""The worker's half of the timed window (remote/window.py): the shared page mapped and registered with CUDA, and the stream memory operations that wait on OPEN and write DONE."""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

PAGE = 4096
OPEN, DONE = 0, 64       # byte offsets of the two words (apart: the GPU writes one, the host the other)
WAIT_GEQ = 0x0           # CU_STREAM_WAIT_VALUE_GEQ


class WindowError(OSError):
    """The gate cannot be set up here (no driver entry point, a page CUDA cannot register)."""


class WorkerWindow:
    """The page mapped and registered with CUDA; `wait` and `done` enqueue stream memory operations."""

    def __init__(self, path: str, torch: Any):
        self.torch = torch
        fd = os.open(path, os.O_RDWR)
        try:
            self.view = mmap.mmap(fd, PAGE)
        finally:
            os.close(fd)
        self._buffer = (ctypes.c_char * PAGE).from_buffer(self.view)
        host = ctypes.addressof(self._buffer)
        err = torch.cuda.cudart().cudaHostRegister(host, PAGE, 0x02)  # cudaHostRegisterMapped
        if int(err) != 0:
            raise WindowError(f"cudaHostRegister of the gate's page: {err}")
        try:
            driver = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise WindowError(f"the CUDA driver library: {exc}") from exc
        pointer = ctypes.c_uint64()
        got = driver.cuMemHostGetDevicePointer_v2(ctypes.byref(pointer), ctypes.c_void_p(host), 0)
        if got:
            raise WindowError(f"cuMemHostGetDevicePointer: CUresult {got}")
        self.device_address = pointer.value
        self._wait = self._function(driver, "cuStreamWaitValue32")
        self._write = self._function(driver, "cuStreamWriteValue32")

    @staticmethod
    def _function(driver: Any, name: str) -> Any:
        for suffix in ("_v2", ""):
            fn = getattr(driver, name + suffix, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
                fn.restype = ctypes.c_int
                return fn
        raise WindowError(f"the CUDA driver has no {name}")

    def _stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream)

    def wait(self, seq: int) -> None:
        got = self._wait(self._stream(), self.device_address + OPEN, seq, WAIT_GEQ)
        if got:
            raise WindowError(f"cuStreamWaitValue32: CUresult {got}")

    def done(self, seq: int) -> None:
        self.write(DONE, seq)

    def write(self, at: int, seq: int) -> None:
        """`seq` into the word at `at`, enqueued on the current stream behind a memory fence."""
        got = self._write(self._stream(), self.device_address + at, seq, 0)
        if got:
            raise WindowError(f"cuStreamWriteValue32: CUresult {got}")
