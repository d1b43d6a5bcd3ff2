"""A judge's GPU child holds its device only for the part that needs it. It starts, imports and collects
without a place on the device, then asks for one (`PLACE`) before its first use of the device; a perf child
then prepares its baseline beside other stages and asks for its turn (`TURN`): the device to itself for
the timed part. Each channel is a folder the environment names: the child writes `want` (what it has
touched so far), the judge writes `go`. While a turn is asked for or held, the checks placed beside it
pause between their items (`PAUSE`: the judge writes `pause`, the child `paused`, the judge removes `pause`).
A child done with its device (its items over, its workers stopped) writes `left` in its channels: its place and
its turn end then, not at its exit (seconds later: its exit handlers, its CUDA context's teardown)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TURN, PLACE, PAUSE = "CUDAOPT_TURN", "CUDAOPT_PLACE", "CUDAOPT_PAUSE"
LEFT = "left"
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


def leave() -> None:
    """A judge's child is done with its device: its work there finished, it writes `left` in each channel it has
    (at once outside a judge: none). Its workers must be stopped first: no code of the candidate's runs after."""
    folders = [os.environ[env] for env in (PLACE, TURN) if os.environ.get(env)]
    if not folders:
        return
    _synchronize()
    for folder in folders:
        try:
            _write(Path(folder, LEFT), repr(time.time()))   # when: the judge may see it late
        except OSError:   # the channel is gone (the judge ended): nothing to tell
            pass


def pause_point(hold=None, folder: Path | None = None) -> None:
    """Between a judge's check child's items: if the judge asks (a turn on its device), its device work done and
    `hold(True)` (its workers stopped), it waits until the judge lets it go on, then `hold(False)`. Else nothing.
    `folder`: else PAUSE's."""
    folder = folder or os.environ.get(PAUSE)
    asked = Path(folder, "pause") if folder else None
    try:
        number = asked.read_text() if asked is not None else ""
    except OSError:
        return
    if not number:
        return
    _synchronize()
    from pytest_cudaopt.run import watchdog

    with watchdog.harness_step("paused for another workdir's turn on the device"):
        if hold is not None:
            hold(True)
        try:
            _write(Path(folder, "paused"), number)
            while _read(asked) == number:
                time.sleep(POLL_S)
        finally:
            if hold is not None:
                hold(False)


_HOLD: list = []   # the check child's `hold` (set_hold): what a pause inside an item stops


def set_hold(hold) -> None:
    """A judge's check child: what `pause_within` stops while paused (its workers and sanitized children)."""
    _HOLD[:] = [hold] if hold is not None else []


def pause_within() -> None:
    """A pause point inside a long item (before each correctness case, while the memory-safety item waits on its
    sanitized children, whose kernels already launched may still finish): a turn then waits for a case to end, not
    for the whole item (a drawn-shapes item's cases took seconds, a sanitizer's run more)."""
    if _HOLD and os.environ.get(PAUSE):
        pause_point(_HOLD[0])


def _synchronize() -> None:
    """This process's device work done, where it has any (a broken context: what runs next meets it and says so)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
        except Exception:
            pass


def _write(path: Path, text: str) -> None:
    """`text` into `path` whole (a reader never sees it half written)."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class Pause:
    """The judge's side of one check child's pause channel: `ask` it to pause, `answered` once it has, `release`
    it; `waited()`: the seconds it sat paused, in all (its time limit grows by them, as by a Turn's wait; not by an
    ask it never met)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("pause", "paused"):
            (self.folder / name).unlink(missing_ok=True)
        self.env = {PAUSE: str(self.folder)}
        self.number = 0
        self.asked = False
        self.paused_at: float | None = None
        self.total = 0.0

    def ask(self) -> None:
        self.number += 1
        self.asked = True
        _write(self.folder / "pause", str(self.number))

    def answered(self) -> bool:
        if self.asked and self.paused_at is None and _read(self.folder / "paused") == str(self.number):
            self.paused_at = time.monotonic()
        return self.paused_at is not None

    def release(self) -> None:
        (self.folder / "pause").unlink(missing_ok=True)
        self.total, self.paused_at, self.asked = self.waited(), None, False

    def waited(self) -> float:
        return self.total + (time.monotonic() - self.paused_at if self.paused_at is not None else 0.0)


class Turn:
    """The judge's side of one channel of one child (`env`: TURN or PLACE): `env` for the child, `wanted`,
    `grant`, `waited`, `left` (done with the device), `held`."""

    def __init__(self, folder: Path, env: str = TURN):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in ("want", "go", LEFT):   # a stage run again starts its channel afresh
            (self.folder / name).unlink(missing_ok=True)
        self.env = {env: str(self.folder)}
        self.asked_at: float | None = None
        self.granted_at: float | None = None
        self.left_at: float | None = None

    def wanted(self) -> bool:
        if self.asked_at is None and (self.folder / "want").exists():
            self.asked_at = time.monotonic()
        return self.asked_at is not None

    def grant(self) -> None:
        self.granted_at = time.monotonic()   # before the `go`: the child may start on it before this thread goes on
        (self.folder / "go").touch()

    def waited(self) -> float:
        """Seconds from the ask to the grant (to now while it waits): the child's limit grows by them (up to itself)."""
        return 0.0 if self.asked_at is None else (self.granted_at or time.monotonic()) - self.asked_at

    def left(self) -> bool:
        """The child said it is done with its device (`leave`); `left_at` is when it wrote so, however late seen."""
        if self.left_at is None:
            try:
                written = float((self.folder / LEFT).read_text())
            except (OSError, ValueError):
                return False
            self.left_at = time.monotonic() - max(0.0, time.time() - written)
        return True

    def held(self) -> float:
        """Seconds from the grant to the child's leaving, else to now (how long it held the device alone)."""
        if self.granted_at is None:
            return 0.0
        return max(0.0, (self.left_at if self.left_at is not None else time.monotonic()) - self.granted_at)
