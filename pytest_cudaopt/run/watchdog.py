"""The `cudaopt_timeout` watchdog: a hung test fails with its case, and the run still ends in a report.

Python code is interrupted by `HangTimeout` once no import is in progress; a C call that releases
the GIL and never returns ends the session through `on_stuck` after GRACE_S; a C loop that holds
the GIL is left to the sentinel (sentinel.py) and faulthandler. A debugger is never interrupted.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable


def _seconds(name: str, default: float) -> float:
    """A wait from the environment (the plugin's own tests shorten them), else `default`."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0 < value < 3600 else default


# After the signal, time for the main thread to leave the test; within it, the signal is sent again
# every RESIGNAL_S; then BACKSTOP_S more before faulthandler's C thread ends a hang that holds the GIL.
GRACE_S = _seconds("CUDAOPT_WATCHDOG_GRACE_S", 5.0)
RESIGNAL_S = 0.25
BACKSTOP_S = _seconds("CUDAOPT_WATCHDOG_BACKSTOP_S", 10.0)
SIGNAL = getattr(signal, "SIGUSR2", None)
WORKDIR_MODULES = "cudaopt_workdir_"  # workdir.MODULE_PREFIX: the workdir's own files
TIMEOUT_MARK = "TIMEOUT:"  # how a timed-out test's failure begins (the judge reads it in the report's items)
HARNESS_SHARE = 0.25  # a hang's message says how long the harness took once it took this share of the test
DEBUGGER_MODULES = ("pdb", "bdb", "pydevd", "_pydevd", "debugpy", "IPython.core.debugger", "ipdb")

_STDERR_FD: int | None = None


class HangTimeout(BaseException):
    """Raised in the main thread when a test runs past `cudaopt_timeout`. A BaseException, so
    Hypothesis neither shrinks nor replays it and the candidate's `except Exception` keeps it."""


def keep_stderr() -> None:
    """Keep a duplicate of fd 2 before output capturing swaps it out, for the watchdog's last words."""
    global _STDERR_FD
    if _STDERR_FD is None:
        with contextlib.suppress(OSError):
            _STDERR_FD = os.dup(2)


def stderr_fd() -> int | None:
    """The duplicate that keep_stderr() kept, if any."""
    return _STDERR_FD


def is_debugging() -> bool:
    """A debugger is attached to the main thread (a trace function, or a debugger's frame on its stack)."""
    if threading.current_thread() is threading.main_thread():
        tracer = getattr(sys.gettrace(), "__module__", None) or ""
        if tracer.startswith(DEBUGGER_MODULES):
            return True
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        name = frame.f_globals.get("__name__", "") or ""
        tracer = getattr(frame.f_trace, "__module__", None) or ""
        if name.startswith(DEBUGGER_MODULES) or tracer.startswith(DEBUGGER_MODULES):
            return True
        frame = frame.f_back
    return False


def in_import(frame) -> bool:
    """The frame is inside an import, unless of a workdir's own file (workdir.import_file drops it)."""
    module = None
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            name = (module.f_globals.get("__name__") or "") if module is not None else ""
            return not name.startswith(WORKDIR_MODULES)
        if frame.f_code.co_name == "<module>":
            module = frame
        frame = frame.f_back
    return False


_held: list[None] = []  # non-empty while held() is in force


@contextlib.contextmanager
def held():
    """While the main thread handles a HangTimeout, the watchdog's resignal waits."""
    _held.append(None)
    try:
        yield
    finally:
        _held.pop()


def main_stack(limit: int = 12) -> str:
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "  (no stack)\n"
    return "".join(traceback.format_stack(frame)[-limit:])


class Watchdog:
    """Watches one test (a context manager around its call); `on_stuck(message)` is called from the
    watchdog thread when the test does not leave after the signal, then the process exits with 1."""

    current: "Watchdog | None" = None
    last: "Watchdog | None" = None  # the latest one entered, still there after it ended

    def __init__(self, timeout: float, test: str,
                 on_stuck: Callable[[str], None] | None = None, backstop: bool = True,
                 on_debugging: Callable[[], None] | None = None,
                 on_case: Callable[[str, str], None] | None = None):
        self.timeout = timeout
        self.test = test
        self.case = ""
        self.replay = ""
        self.stage = ""  # what the test does before its cases ("loading the workdir ...")
        self.step = ""   # the harness's own step running now (`harness_step`), "" in the candidate's time
        self.harness_s = 0.0  # seconds the harness's own steps took so far
        self._step_started = 0.0
        self._started = time.monotonic()
        self._fired_at: tuple[str, float, float] | None = None  # (step, harness seconds, elapsed) when it fired
        self._on_case = on_case
        self.fired = False
        self._on_stuck = on_stuck
        self._backstop = backstop
        self._on_debugging = on_debugging
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler: Any = None
        self._installed = False
        self._raised: HangTimeout | None = None

    def harness_now(self) -> tuple[str, float, float]:
        """(the harness step running now or "", the harness's seconds so far, the test's seconds so far)."""
        now = time.monotonic()
        running = now - self._step_started if self.step else 0.0
        return self.step, self.harness_s + running, now - self._started

    def message(self) -> str:
        case = f" on case {self.case}" if self.case else ""
        replay = f"\nreplay: {self.replay}" if self.replay else ""
        if self.stage:
            return (f"{TIMEOUT_MARK} {self.test} ran longer than cudaopt_timeout={self.timeout:g}s while {self.stage}; "
                    f"an import, a build or a get_inputs() that never ends{replay}")
        step, harness, elapsed = self._fired_at or self.harness_now()
        share = f"the harness's own steps took {_seconds_text(harness)} of the test's {_seconds_text(elapsed)}"
        if step:  # the limit came in the harness's own work: no word of a hang of the candidate's
            return (f"{TIMEOUT_MARK} {self.test} ran longer than cudaopt_timeout={self.timeout:g}s{case} while the "
                    f"harness was {step}, its own work, not the candidate's ({share}); the sizes are too large to "
                    f"judge within the limit on this machine: raise cudaopt_timeout, or shrink model.py's "
                    f"constants{replay}")
        more = f" ({share})" if harness >= HARNESS_SHARE * max(elapsed, 1e-9) else ""
        return (f"{TIMEOUT_MARK} {self.test} ran longer than cudaopt_timeout={self.timeout:g}s{case}; "
                f"a kernel that never finishes, a deadlock or an endless loop{more}{replay}")

    def _fd(self) -> int:
        return _STDERR_FD if _STDERR_FD is not None else 2

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self._fd(), text.encode(errors="replace"))

    def _handler(self, signum, frame) -> None:
        # Resignalled until the frame is at a line outside an import and not held(). Always the same
        # exception: what was attached to it (a worker's stacks) stays if it is raised again.
        if self.fired and not self._done.is_set() and not _held and not in_import(frame) \
                and getattr(frame, "f_lineno", None) is not None:
            if self._raised is None:
                self._raised = HangTimeout(self.message())
            raise self._raised.with_traceback(None)

    def _watch(self) -> None:
        while not self._done.wait(self.timeout):
            if not is_debugging():
                break
            faulthandler.cancel_dump_traceback_later()  # never kill a debugging session
            if self._on_debugging is not None:
                self._on_debugging()
        else:
            return
        self._fired_at = self.harness_now()
        self.fired = True
        # Signalled again until the test leaves: the handler lets a module finish importing.
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            if self._installed:
                signal.pthread_kill(threading.main_thread().ident, SIGNAL)
            if self._done.wait(min(RESIGNAL_S, max(0.0, deadline - time.monotonic()))):
                return
        # The main thread is stuck in C code that released the GIL and does not return.
        self._write(f"\n\ncudaopt: {self.message()}. The test did not stop within {GRACE_S:g}s of "
                    f"being interrupted; the run ends here with status 1. Where the test was "
                    f"(innermost last):\n{main_stack()}")
        try:
            if self._on_stuck is not None:
                self._on_stuck(self.message())
        except BaseException as exc:  # noqa: BLE001  the process ends either way
            self._write(f"cudaopt: writing the reports after the timeout failed: {exc!r}\n")
        finally:
            os._exit(1)

    def __enter__(self) -> "Watchdog":
        Watchdog.current = Watchdog.last = self
        self._started = time.monotonic()
        if SIGNAL is not None and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(SIGNAL, self._handler)
            self._installed = True
        self._thread = threading.Thread(target=self._watch, name="cudaopt-watchdog", daemon=True)
        self._thread.start()
        if self._backstop:
            faulthandler.dump_traceback_later(self.timeout + GRACE_S + BACKSTOP_S, exit=True, file=self._fd())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()
        if self._installed:
            signal.signal(SIGNAL, self._previous_handler if self._previous_handler is not None else signal.SIG_DFL)
            self._installed = False
        if Watchdog.current is self:
            Watchdog.current = None


def set_case(text: str, replay: str = "") -> None:
    """Tell the running watchdog which case is running and how to replay it alone."""
    dog = Watchdog.current
    if dog is not None:
        dog.case, dog.replay = text, replay
        if dog._on_case is not None:
            dog._on_case(text, replay)


def _seconds_text(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 100 else f"{seconds:.0f} s"


@contextlib.contextmanager
def harness_step(text: str):
    """The harness's own work inside a test, timed apart from the candidate's: a time limit met
    inside it says so instead of calling it a hang. Nested steps count once."""
    dog = Watchdog.current
    if dog is None or dog.step:
        yield
        return
    dog.step, dog._step_started = text, time.monotonic()
    try:
        yield
    finally:
        dog.harness_s += time.monotonic() - dog._step_started
        dog.step = ""


def harness_seconds() -> float:
    """The seconds the running test spent in `harness_step`s so far (0 outside a watched test)."""
    dog = Watchdog.current
    return dog.harness_now()[1] if dog is not None else 0.0


def set_stage(text: str) -> None:
    """Tell the running watchdog that the test sets its workdir up now."""
    dog = Watchdog.current
    if dog is not None:
        dog.stage = text
