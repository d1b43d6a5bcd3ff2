"""A perf child's turn alone on its GPU under `cudaopt judge`: it starts beside other checks (its process, pytest's
start-up and collection, the worker's launch), then asks for the GPU before the worker's clocks are calibrated
and waits until the judge has emptied it; it keeps it to its end. Outside the judge (no CUDAOPT_ALONE_DIR)
nothing waits.

The child writes WANTED in the folder; the judge writes GRANTED once nothing else runs on the device. The
folder is the stage's output folder, which a confined worker cannot write."""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "CUDAOPT_ALONE_DIR"
WANTED, GRANTED = "alone.wanted", "alone.granted"
POLL_S = 0.01


def wait_for_device() -> float:
    """In the perf child, before the worker calibrates and before the first timed call (once is enough): ask for
    the GPU alone and wait for it; the seconds waited.
    The item's watchdog is paused meanwhile (the wait is the judge's, not the candidate's)."""
    folder = os.environ.get(ENV)
    if not folder:
        return 0.0
    granted = Path(folder) / GRANTED
    if granted.exists():  # a second perf item of the session: the device is still this child's
        return 0.0
    from pytest_cudaopt.run import watchdog

    started = time.monotonic()
    (Path(folder) / WANTED).write_text(str(os.getpid()))
    with watchdog.paused():
        while not granted.exists():
            time.sleep(POLL_S)
    return time.monotonic() - started


def prepare(folder: Path) -> None:
    """The judge's side, before the child starts: an empty folder for the two files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (WANTED, GRANTED):
        (folder / name).unlink(missing_ok=True)


def wanted(folder: Path) -> bool:
    return (folder / WANTED).exists()


def grant(folder: Path) -> None:
    (folder / GRANTED).write_text("")


def waited(folder: Path) -> float:
    """Seconds between the child's asking and the grant (up to now while it waits): not the child's own time."""
    try:
        asked = (folder / WANTED).stat().st_mtime
    except OSError:
        return 0.0
    try:
        given = (folder / GRANTED).stat().st_mtime
    except OSError:
        given = time.time()
    return max(0.0, given - asked)
