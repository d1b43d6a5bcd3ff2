"""A judge's perf child has its device to itself for the timed part only: it starts, imports and compiles
the baseline beside other stages, then asks for its turn and waits. The channel is a folder (`ENV`): the
child writes `want`, the judge writes `go` once nothing else runs on the device."""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "CUDAOPT_TURN"
POLL_S = 0.002


def pending() -> bool:
    """This process is a perf child that must wait for its turn before any candidate code runs."""
    return bool(os.environ.get(ENV)) and not Path(os.environ[ENV], "go").exists()


def wait(folder: Path | None = None) -> None:
    """Ask for the device alone and wait for it (at once outside a judge, or once granted). `folder`: else ENV's."""
    if folder is None and not pending():
        return
    folder = Path(folder or os.environ[ENV])
    (folder / "want").touch()
    while not (folder / "go").exists():
        time.sleep(POLL_S)


class Turn:
    """The judge's side of one perf child's turn: `env` for the child, `wanted`, `grant`, `waited`."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("want", "go"):   # a stage run again starts its turn afresh
            (self.folder / name).unlink(missing_ok=True)
        self.env = {ENV: str(self.folder)}
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
