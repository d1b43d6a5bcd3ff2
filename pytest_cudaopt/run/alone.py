"""A perf child's turns alone on its GPU under `cudaopt judge`: for its worker's clock calibration (before any
workdir code loads) and for its timed rounds and traces; the rest runs beside the checks. Turn N: the child
writes `wanted.N`, the judge `granted.N` once nothing else runs on the device, the child `released.N`. The folder
(CUDAOPT_ALONE_DIR, unset outside the judge) is the stage's output folder, which a confined worker cannot write."""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "CUDAOPT_ALONE_DIR"
POLL_S = 0.01
_state = {"turn": 0, "holding": False}   # this child's


def wait_for_device() -> float:
    """In the perf child: a turn alone on the GPU, waited for (a no-op while one is held); the seconds waited.
    The item's watchdog is paused meanwhile (the wait is the judge's, not the candidate's)."""
    folder = os.environ.get(ENV)
    if not folder or _state["holding"]:
        return 0.0
    from pytest_cudaopt.run import watchdog

    _state["turn"] += 1
    turn, started = _state["turn"], time.monotonic()
    (Path(folder) / f"wanted.{turn}").write_text(str(os.getpid()))
    granted = Path(folder) / f"granted.{turn}"
    with watchdog.paused():
        while not granted.exists():
            time.sleep(POLL_S)
    _state["holding"] = True
    return time.monotonic() - started


def release() -> None:
    """In the perf child: the device goes back to sharing until the next wait_for_device."""
    folder = os.environ.get(ENV)
    if folder and _state["holding"]:
        (Path(folder) / f"released.{_state['turn']}").write_text("")
        _state["holding"] = False


def prepare(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        path.unlink()


def wanted(folder: Path, turn: int) -> bool:
    return (folder / f"wanted.{turn}").exists()


def released(folder: Path, turn: int) -> bool:
    return (folder / f"released.{turn}").exists()


def grant(folder: Path, turn: int) -> None:
    (folder / f"granted.{turn}").write_text("")


def waited(folder: Path) -> float:
    """Seconds between each turn's asking and its grant (up to now while it waits): not the child's own time."""
    total, turn = 0.0, 1
    while True:
        try:
            asked = (folder / f"wanted.{turn}").stat().st_mtime
        except OSError:
            return total
        try:
            given = (folder / f"granted.{turn}").stat().st_mtime
        except OSError:
            given = time.time()
        total += max(0.0, given - asked)
        turn += 1
