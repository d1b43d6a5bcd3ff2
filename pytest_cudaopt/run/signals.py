"""SIGINT and SIGTERM in the pytest process become pytest's interrupt (exit status 2; the summary, the JUnit file and the JSON report written), never in the middle of an import.

An interrupt inside an import leaves a half-made module that later code trips on, and SIGTERM
would kill the process with no report; a second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pytest_cudaopt.run.watchdog import in_import

DEFER_S = 60.0     # the longest an import in progress delays the interrupt (torch's takes seconds)
RESIGNAL_S = 0.1   # meanwhile the signal is delivered again this often
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_previous: dict[int, Any] = {}     # signal -> the handler before ours
_first_seen: dict[int, float] = {}  # signal -> when it arrived, while deferred
_timers: list[threading.Timer] = []  # the deliveries of a deferred signal still to come
_ours: dict[int, int] = {}          # signal -> deliveries made by the timers, not yet handled
_ours_lock = threading.Lock()       # the timers count up, the handler (main thread) down
received: list[str] = []            # the names of the signals that interrupted the run
_caught = [0]                       # how many of them pytest has caught (the rest were raised and lost)
_finishing = [False]                # the session writes its reports: a signal now is said, not raised ...
_finish_seen: set[int] = set()      # ... and which came (a second Ctrl-C is raised)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as pytest's interrupt."""


def install() -> None:
    """Our handler for SIGINT and SIGTERM, where the handler in place is Python's default."""
    if threading.current_thread() is not threading.main_thread():
        return
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    for signum in SIGNALS:
        if signum not in _previous and signal.getsignal(signum) is defaults[signum]:
            _previous[signum] = signal.signal(signum, _handler)


def uninstall() -> None:
    """Python's handlers again; a signal still deferred is said, not raised outside pytest's reach."""
    if threading.current_thread() is not threading.main_thread():
        return
    _finishing[0] = False
    _finish_seen.clear()
    for timer in _timers:
        timer.cancel()
    _timers.clear()
    for signum in list(_first_seen):
        sys.stderr.write(f"cudaopt: {signal.Signals(signum).name} arrived while the run's last imports ran, "
                         "after its verdicts\n")
        del _first_seen[signum]
    for signum, handler in list(_previous.items()):
        if signal.getsignal(signum) is _handler:
            signal.signal(signum, handler)
        del _previous[signum]


def finishing() -> None:
    """Every verdict is in and the session writes its reports: a signal from now on is said on stderr and the run
    ends as it would have (raised in the middle of a report, it left none, and a passing run read as a crash)."""
    _finishing[0] = True


def caught() -> None:
    """pytest caught the interrupt (its pytest_keyboard_interrupt hook)."""
    _caught[0] = len(received)


def raise_lost() -> None:
    """Raise again an interrupt raised inside C code that discarded it (torch.compile's does, about one
    time in ten while it compiles), so that the run ends as interrupted rather than going on."""
    if len(received) > _caught[0]:
        raise Terminated("SIGTERM: the run was asked to stop") if "SIGTERM" in received else KeyboardInterrupt


def reason() -> str:
    """What interrupted the run, for the report: "SIGTERM", "SIGINT (Ctrl-C)", or ""."""
    return ", then ".join(received)


def _handler(signum: int, frame) -> None:
    now = time.monotonic()
    with _ours_lock:
        ours = _ours.get(signum, 0) > 0
        if ours:
            _ours[signum] -= 1
    name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT (Ctrl-C)"
    if _finishing[0]:   # said as it comes (a deferred one, not said when it came, once among its deliveries)
        if signum == signal.SIGINT and not ours and signum in _finish_seen:
            raise KeyboardInterrupt   # Ctrl-C twice: at once, as ever (an end that hangs)
        if not ours or _first_seen.pop(signum, None) is not None:
            _finish_seen.add(signum)
            sys.stderr.write(f"cudaopt: {name} while the run writes its reports: they are written, then it ends\n")
        return
    again = signum in _first_seen and not ours  # pressed again while deferred: at once
    first = _first_seen.setdefault(signum, now)
    # A frame between two lines (f_lineno None) would break pytest's report of the interrupt.
    if (in_import(frame) or frame is None or frame.f_lineno is None) and now - first < DEFER_S and not again:
        timer = threading.Timer(RESIGNAL_S, _deliver, (threading.main_thread().ident, signum))
        timer.daemon = True
        _timers[:] = [t for t in _timers if t.is_alive()] + [timer]
        timer.start()
        return
    del _first_seen[signum]
    with _ours_lock:
        _ours.pop(signum, None)
    if signum == signal.SIGTERM and "SIGTERM" in received:
        # pytest is already ending on the first one: let it write its files (SIGKILL ends it now).
        sys.stderr.write("cudaopt: SIGTERM again while the run ends; it is writing its reports\n")
        return
    received.append(name)
    if signum == signal.SIGTERM:
        raise Terminated("SIGTERM: the run was asked to stop")
    raise KeyboardInterrupt


def _deliver(thread_id: int, signum: int) -> None:
    with _ours_lock:
        _ours[signum] = _ours.get(signum, 0) + 1
    try:
        signal.pthread_kill(thread_id, signum)
    except (OSError, ValueError):
        with _ours_lock:
            _ours[signum] -= 1


def not_dumpable() -> bool:
    """Make this process non-dumpable (no ptrace or /proc/PID/mem by others); True when it held."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    PR_SET_DUMPABLE = 4
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):
        return False


def process_stat(pid: int | str) -> tuple[str, str, int] | None:
    """(name, state, process group) of `pid` from /proc (state: R running, S sleeping, D in the kernel, T stopped,
    Z a zombie), or None when it is gone or not to be read."""
    try:
        name, rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
        state, _, group = rest.split()[:3]
        return name.split("(", 1)[1], state, int(group)
    except (OSError, ValueError, IndexError):
        return None
