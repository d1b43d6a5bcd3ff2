"""Device memory per process, as NVML tells it (libnvidia-ml.so.1 through ctypes): who holds a device's memory."""

from __future__ import annotations

import ctypes
import json
import os
import threading
from typing import Any

LIBRARY = "libnvidia-ml.so.1"
# A JSON list of {"pid", "used_bytes"} read instead of NVML (a CPU machine's stand-in table).
TABLE_ENV = "CUDAOPT_NVML_TABLE"
NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
TABLE: list[dict[str, int]] | None = None  # when set, answers instead of NVML (a test's)
_lock = threading.Lock()
_state: dict[str, Any] = {}


class _ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t (the v3 functions take the same layout)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_t of drivers before the v2 functions."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


# The process-list functions, newest first, with the layout each fills.
_FUNCTIONS = (("nvmlDeviceGetComputeRunningProcesses_v3", _ProcessInfoV2),
              ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfoV2),
              ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1))


def _library() -> Any:
    """The initialised NVML library, or None where it cannot be loaded or initialised (tried once)."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        lib = None
        try:
            found = ctypes.CDLL(LIBRARY)
            init = getattr(found, "nvmlInit_v2", None) or found.nvmlInit
            if init() == NVML_SUCCESS:
                lib = found
        except (OSError, AttributeError):
            lib = None
        _state["lib"] = lib
        return lib


def available() -> bool:
    """Whether NVML (or a stand-in table) can answer."""
    return _table() is not None or _library() is not None


def _table() -> list[dict[str, int]] | None:
    if TABLE is not None:
        return [dict(p) for p in TABLE]
    text = os.environ.get(TABLE_ENV)
    if not text:
        return None
    try:
        return [{"pid": int(p["pid"]), "used_bytes": int(p["used_bytes"])} for p in json.loads(text)]
    except (ValueError, TypeError, KeyError):
        return None


def _query(lib: Any, handle: Any, name: str, layout: type) -> list[dict[str, int]] | None:
    """One process-list function's answer (None: the function is missing or failed)."""
    function = getattr(lib, name, None)
    if function is None:
        return None
    count = ctypes.c_uint(0)
    status = function(handle, ctypes.byref(count), None)
    if status not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
        return None
    for _ in range(3):  # the list may grow between the two calls
        room = count.value + 8
        infos = (layout * room)()
        count = ctypes.c_uint(room)
        status = function(handle, ctypes.byref(count), infos)
        if status == NVML_SUCCESS:
            return [{"pid": int(infos[i].pid),
                     "used_bytes": 0 if infos[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE else int(infos[i].usedGpuMemory)}
                    for i in range(count.value)]
        if status != NVML_ERROR_INSUFFICIENT_SIZE:
            return None
    return None


def processes(index: int = 0) -> list[dict[str, int]]:
    """The compute processes on device `index` (NVML's numbering); [] where NVML does not answer."""
    table = _table()
    if table is not None:
        return table
    lib = _library()
    if lib is None:
        return []
    with _lock:
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != NVML_SUCCESS:
            return []
        for name, layout in _FUNCTIONS:
            found = _query(lib, handle, name, layout)
            if found is not None:
                return found
    return []


def index_of(cuda_index: int) -> int:
    """NVML's index of the device CUDA numbers `cuda_index` (CUDA_VISIBLE_DEVICES renumbers only CUDA's)."""
    listed = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if listed and all(part.isdigit() for part in listed) and cuda_index < len(listed):
        return int(listed[cuda_index])
    return cuda_index


def used_by(pid: int | None, index: int = 0) -> int | None:
    """Bytes of device `index` that process `pid` holds; None where NVML cannot tell."""
    if pid is None or not available():
        return None
    return sum(p["used_bytes"] for p in processes(index) if p["pid"] == pid)
