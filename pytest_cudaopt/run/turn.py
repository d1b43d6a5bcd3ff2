"""A judge's GPU child holds its device only for the part that needs it. It starts, imports and collects
without a place on the device, then asks for one (`PLACE`) before its first use of the device; a perf child
then prepares its baseline beside other stages and asks for its turn (`TURN`): the device to itself for
the timed part. Each channel is a folder the environment names: the child writes `want` (what it has
touched so far), the judge writes `go`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TURN, PLACE = "CUDAOPT_TURN", "CUDAOPT_PLACE"
ENV = TURN
POLL_S = 0.002


def pending(env: str = TURN) -> bool:
    """This process is a judge's child that must wait for the judge's `go` on channel `env`."""
    return bool(os.environ.get(env)) and not Path(os.environ[env], "go").exists()


def wait(folder: Path | None = None, env: str = TURN) -> None:
    """Ask and wait for the `go` (at once outside a judge, or once granted). `folder`: else `env`'s."""
    if folder is None and not pending(env):
        return
    folder = Path(folder or os.environ[env])
    torch = sys.modules.get("torch")
    touched = bool(torch is not None and torch.cuda.is_initialized())
    (folder / "want").write_text(json.dumps({"cuda_initialized": touched, "cuda_context": touched and _context()}))
    while not (folder / "go").exists():
        time.sleep(POLL_S)


def _context() -> bool | None:
    """Whether this process holds a CUDA context on its device (the driver's primary context is active)."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
        flags, active = ctypes.c_uint(), ctypes.c_int()
        if driver.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return bool(active.value)


def enter_place() -> None:
    """Before a judge's child first uses its device: its place there (at once outside a judge)."""
    if pending(PLACE):
        from pytest_cudaopt.run import watchdog

        with watchdog.harness_step("waiting for a place on the device (the judge's other stages on it)"):
            wait(env=PLACE)


class Turn:
    """The judge's side of one channel of one child (`env`: TURN or PLACE): `env` for the child, `wanted`,
    `grant`, `waited`, `held`."""

    def __init__(self, folder: Path, env: str = TURN):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("want", "go"):   # a stage run again starts its channel afresh
            (self.folder / name).unlink(missing_ok=True)
        self.env = {env: str(self.folder)}
        self.asked_at: float | None = None
        self.granted_at: float | None = None

    def wanted(self) -> bool:
        if self.asked_at is None and (self.folder / "want").exists():
            self.asked_at = time.monotonic()
        return self.asked_at is not None

    def grant(self) -> None:
        (self.folder / "go").touch()
        self.granted_at = time.monotonic()

    def waited(self) -> float:
        """Seconds from the ask to the grant (to now while it waits): the child's limit grows by them (up to itself)."""
        return 0.0 if self.asked_at is None else (self.granted_at or time.monotonic()) - self.asked_at

    def held(self) -> float:
        """Seconds from the grant to now (at the stage's end: how long it held the device alone)."""
        return time.monotonic() - self.granted_at if self.granted_at is not None else 0.0
