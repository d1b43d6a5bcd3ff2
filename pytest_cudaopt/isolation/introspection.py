"""Frames and the object graph out of the candidate's reach: reads of interpreter frames, tracers and the garbage collector's lists from model_new.py, noted by an audit hook.

Through a frame, candidate code reaches the harness's locals: the expected output of the timed
call it is in, the reference, the baselines. Every way to a frame from Python passes an audit
event (PEP 578): `sys._getframe` (also under `inspect.currentframe`, `traceback.walk_stack`,
`logging.currentframe`), `sys._current_frames`, a traceback's, generator's or coroutine's frame
(`tb_frame`, `gi_frame`, `cr_frame`, `ag_frame`), tracers (`sys.settrace`, `sys.setprofile`),
and `gc.get_objects` / `get_referrers` / `get_referents` reach every object. The hook is
installed once per process, before any workdir code runs, and stays (an audit hook cannot be
removed); it costs a set lookup per audited event. A read counts when the frame that made it
is a watched model_new.py (or inspect's or traceback's functions called from there): the
standard library looking up its caller's module name (`typing.TypeVar`, `collections.namedtuple`,
`logging`), torch (torch.compile reads frames) and the harness are not the candidate. The static
rule MN006 refuses these calls and attributes in model_new.py outright; the hook is what holds
when a spelling gets past it. `Watch.verify` reports what was read.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

EVENTS = {
    "sys._getframe": "sys._getframe()",
    "sys._getframemodulename": "sys._getframemodulename()",
    "sys._current_frames": "sys._current_frames()",
    "sys.settrace": "sys.settrace()",
    "sys.setprofile": "sys.setprofile()",
    "gc.get_objects": "gc.get_objects()",
    "gc.get_referrers": "gc.get_referrers()",
    "gc.get_referents": "gc.get_referents()",
}
# The frame attributes whose reads raise an audit event (f_back does not: a frame is needed first).
AUDITED_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
KEPT = 12  # readings kept until the next verification; the first ones say enough


@dataclass(frozen=True)
class Reading:
    """One read: what (`sys._getframe()`, `.tb_frame`) and where in model_new.py."""

    what: str
    file: str
    line: int

    def line_text(self, workdir: Path | None) -> str:
        shown = self.file
        if workdir is not None:
            try:
                shown = str(Path(self.file).resolve().relative_to(Path(workdir).resolve()))
            except ValueError:
                pass
        return f"{self.what} at {shown}:{self.line}"


_installed = False
_watched: set[str] = set()
_readings: list[Reading] = []
_inside = threading.local()
# Standard-library modules whose functions hand their caller a frame: a read made inside them
# is their caller's (inspect.currentframe(), traceback.walk_stack()).
_HANDING_FRAMES = ("inspect.py", "traceback.py")
_real: dict[str, str] = {}
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep


def install() -> None:
    """Add the audit hook (once per process)."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def reset() -> None:
    """A new session: no file watched, nothing read."""
    install()
    _watched.clear()
    _readings.clear()


def watch_file(path: Path) -> None:
    """Reads made from `path` (a workdir's model_new.py) count from now on."""
    install()
    _watched.add(os.path.realpath(path))


def take_readings() -> list[Reading]:
    """The reads noted since the last call (and forget them)."""
    found = list(_readings)
    _readings.clear()
    return found


def _realpath(name: str) -> str:
    if name not in _real:
        _real[name] = os.path.realpath(name)
    return _real[name]


def _hook(event: str, args: tuple) -> None:
    if event == "object.__getattr__":
        if len(args) < 2 or args[1] not in AUDITED_ATTRIBUTES:
            return
        what = f".{args[1]}"
    elif event in EVENTS:
        what = EVENTS[event]
    else:
        return
    if not _watched or getattr(_inside, "busy", False):
        return
    _inside.busy = True  # the frame walk below raises audit events of its own
    try:
        frame = sys._getframe(1)  # the frame that made the read
        while frame is not None and os.path.basename(frame.f_code.co_filename) in _HANDING_FRAMES \
                and _realpath(frame.f_code.co_filename).startswith(_STDLIB):
            frame = frame.f_back
        if frame is not None and _realpath(frame.f_code.co_filename) in _watched and len(_readings) < KEPT:
            _readings.append(Reading(what, frame.f_code.co_filename, frame.f_lineno))
    finally:
        _inside.busy = False


def failure(readings: list[Reading], phase: str, workdir: Path | None) -> str:
    """The message of an item that `readings` fail."""
    lines = [f"candidate code read the interpreter's frames or object graph ({phase}):"]
    seen: list[str] = []
    for reading in readings:
        text = reading.line_text(workdir)
        if text not in seen:
            seen.append(text)
    lines += [f"  {text}" for text in seen]
    lines.append("model_new.py may not read frames (sys._getframe, inspect, traceback and generator frames), "
                 "tracers or the garbage collector's object lists: through them it reaches the harness's "
                 "state (the expected outputs, the reference, the baselines); see docs/isolation.md")
    return "\n".join(lines)
