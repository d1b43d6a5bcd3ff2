"""Judged items under supervision: the `cudaopt_timeout` watchdog, the sentinel beside pytest, CUDA faults kept, and what a hang leaves behind.

The plugin's hooks hand off here: `start_sentinel` when collection finishes, `run_judged` around
each correctness and perf item's call (a hook wrapper's body), and the watchdog's last resort,
`end_session`, which reports the stuck item and the rest through pytest's public hooks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from pytest_cudaopt import sentinel as sentinel_process, watchdog

SENTINEL_PLUGIN = "cudaopt-sentinel"


def judged(item: pytest.Item) -> bool:
    """A correctness, perf or memory-safety item (what runs under supervision)."""
    return any(item.get_closest_marker(m) for m in ("correctness", "perf", "memsafety"))


def start_sentinel(session: pytest.Session) -> None:
    """A run that executes correctness or perf items in this process gets a sentinel
    (sentinel.py): if the process dies before its session finishes, it writes the JUnit file
    and a summary. Not on pytest-xdist workers or their controller (which reports a crashed
    worker itself), nor with --collect-only."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly or not any(map(judged, session.items)):
        return
    xmlpath = getattr(config.option, "xmlpath", None)
    started = sentinel_process.Sentinel.start(
        items=[sentinel_process.junit_names(item.nodeid, getattr(config.option, "junitprefix", None))
               for item in session.items],
        junit=str(config.invocation_params.dir / xmlpath) if xmlpath else None,
        suite=config.getini("junit_suite_name") if xmlpath else "pytest",
        stderr_fd=watchdog.stderr_fd())
    if started is not None:
        config.pluginmanager.register(SentinelHooks(started), SENTINEL_PLUGIN)


class SentinelHooks:
    """Tells the sentinel each item's start and outcome, and the end of the session."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.sentinel.started(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        longrepr = report.longrepr
        if report.skipped and isinstance(longrepr, tuple):  # (path, line, "Skipped: reason")
            text = str(longrepr[2])
        else:
            text = report.longreprtext
        self.sentinel.reported(report.nodeid, report.when, report.outcome, text, report.duration)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.sentinel.finish()


def _sentinel(config: pytest.Config):
    hooks = config.pluginmanager.get_plugin(SENTINEL_PLUGIN)
    return hooks.sentinel if hooks is not None else None


def _faulthandler_timeout(config: pytest.Config) -> float:
    try:
        return float(config.getini("faulthandler_timeout") or 0)
    except ValueError:  # `-p no:faulthandler`: the ini key is not registered
        return 0.0


def run_judged(item: pytest.Item, session, workdir: Path):
    """The body of the plugin's `pytest_runtest_call` wrapper for a judged item: the call under
    the `cudaopt_timeout` watchdog (watchdog.py), the sentinel's backstop set for it, and a CUDA
    fault it raises kept so that later items report it instead of failing in its wake."""
    from pytest_cudaopt.correctness.guards import import_lazy_modules

    import_lazy_modules()
    if not hasattr(item.config, "workerinput"):
        # What remains if nothing can interrupt a hang. A pytest-xdist worker writes none: its
        # controller survives a worker's death, reports the item as crashed and writes the report.
        session.write_report(running=item.nodeid)
    correctness = bool(item.get_closest_marker("correctness"))

    def on_stuck(message: str) -> None:
        session.record_hang(workdir, item.nodeid, dog.case, message, correctness)
        end_session(item, message)

    # pytest's faulthandler_timeout owns faulthandler's single timer when it is set.
    backstop = not _faulthandler_timeout(item.config)
    sentinel = _sentinel(item.config)
    on_debugging = None
    if sentinel is not None:  # its last words come a second before faulthandler's exit
        after = watchdog.GRACE_S + watchdog.BACKSTOP_S - 1
        sentinel.backstop(session.settings.timeout + after, f"ran longer than cudaopt_timeout="
                          f"{session.settings.timeout:g}s and was still running {after:g} s later")
        on_debugging = lambda: sentinel.backstop(None)  # noqa: E731
    dog = watchdog.Watchdog(session.settings.timeout, item.nodeid, on_stuck=on_stuck, backstop=backstop,
                            on_debugging=on_debugging)
    hung = False
    try:
        with dog:
            return (yield)
    except watchdog.HangTimeout:
        hung = True
    except BaseException as exc:
        session.note_fault(item.nodeid, exc)
        raise
    finally:
        if sentinel is not None:
            sentinel.backstop(None)
    if hung:  # outside the except block: the failure alone, no exception chain
        message = dog.message()
        session.record_hang(workdir, item.nodeid, dog.case, message, correctness)
        pytest.fail(f"{message}; the later correctness and perf items of this workdir are not run",
                    pytrace=False)


def end_session(item: pytest.Item, message: str) -> None:
    """From the watchdog thread, while the main thread is stuck in `item` (C code that does not
    return): report `item` as failed with `message` and every later item as skipped ("not
    run"), then run pytest's session finish (terminal summary, --junitxml, --cudaopt-report).
    The watchdog exits the process next. On a pytest-xdist worker only the failure is
    reported: the controller owns the other items and the session's end, and reports the
    worker's exit as a crash of `item`."""
    config, session = item.config, item.session
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        try:
            capman.suspend_global_capture(in_=True)
        except Exception:  # noqa: BLE001  already suspended, or never started
            pass
    now = time.time()
    hook = config.hook
    hook.pytest_runtest_logreport(report=pytest.TestReport(
        item.nodeid, item.location, {name: 1 for name in item.keywords}, "failed", message, "call",
        start=now, stop=now))
    if hasattr(config, "workerinput"):
        return
    items = list(session.items)
    later = items[items.index(item) + 1:] if item in items else []
    reason = f"not run: the run ended after {item.nodeid} timed out"
    for other in later:
        path, lineno, _ = other.location
        hook.pytest_runtest_logstart(nodeid=other.nodeid, location=other.location)
        hook.pytest_runtest_logreport(report=pytest.TestReport(
            other.nodeid, other.location, {name: 1 for name in other.keywords}, "skipped",
            (str(config.rootpath / path), (lineno or 0) + 1, reason), "setup", start=now, stop=now))
        hook.pytest_runtest_logfinish(nodeid=other.nodeid, location=other.location)
    # The exit status is 1 whatever pytest counted: the watchdog exits with it.
    hook.pytest_sessionfinish(session=session, exitstatus=1)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
