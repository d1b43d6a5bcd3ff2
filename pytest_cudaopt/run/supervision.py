"""Items under supervision: the `cudaopt_timeout` watchdog, the sentinel beside pytest, CUDA faults kept, and what a hang leaves behind."""

from __future__ import annotations

import linecache
import re
import sys
import time
from pathlib import Path

import pytest

from pytest_cudaopt.results import blame, ledger
from pytest_cudaopt.run import sentinel as sentinel_process, signals, watchdog

SENTINEL_PLUGIN = "cudaopt-sentinel"


def judged(item: pytest.Item) -> bool:
    """A correctness, perf or memory-safety item (what runs under supervision)."""
    return any(item.get_closest_marker(m) for m in ("correctness", "perf", "memsafety"))


def static(item: pytest.Item) -> bool:
    """A policy item of a rule that only reads files: it runs nothing of the workdir's."""
    from pytest_cudaopt.policy.rules import IMPORTS_WORKDIR, RULES

    callspec = getattr(item, "callspec", None)
    rule = callspec.params.get("rule") if callspec is not None else None
    return bool(item.get_closest_marker("policy")) and rule in RULES and rule not in IMPORTS_WORKDIR


def start_sentinel(session: pytest.Session, supervised, report: str | None = None) -> None:
    """A sentinel for a run that executes supervised items in this process (not under pytest-xdist)."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly or not any(map(supervised, session.items)):
        return
    xmlpath = getattr(config.option, "xmlpath", None)
    started = sentinel_process.Sentinel.start(
        items=[sentinel_process.junit_names(item.nodeid, getattr(config.option, "junitprefix", None))
               for item in session.items],
        junit=str(config.invocation_params.dir / xmlpath) if xmlpath else None,
        suite=config.getini("junit_suite_name") if xmlpath else "pytest",
        stderr_fd=watchdog.stderr_fd(), report=report)
    if started is not None:
        config.pluginmanager.register(SentinelHooks(started), SENTINEL_PLUGIN)


class SentinelHooks:
    """Tells the sentinel each item's start and outcome, and the end of the session."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.sentinel.send({"start": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        skip = report.longrepr if report.skipped and isinstance(report.longrepr, tuple) else None
        text = str(skip[2]) if skip else report.longreprtext
        self.sentinel.send({"report": report.nodeid, "when": report.when, "outcome": report.outcome, "text": text,
                            "duration": report.duration})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.sentinel.finish()


def run_supervised(item: pytest.Item, session, workdir: Path, phase: str):
    """The body of the plugin's setup and call wrappers for a supervised item."""
    if phase == "setup" and not hasattr(item.config, "workerinput"):
        # What remains if nothing can interrupt a hang. A pytest-xdist worker writes none: its
        # controller survives a worker's death, reports the item as crashed and writes the report.
        session.write_report(running=item.nodeid)
    correctness = bool(item.get_closest_marker("correctness"))

    def on_stuck(message: str) -> None:
        session.record_hang(workdir, item.nodeid, dog.case, message, correctness, setup=bool(dog.stage))
        session.ledger.end(ledger.TIMEOUT, f"the run ended after {item.nodeid} timed out")
        end_session(item, message)

    # pytest's faulthandler_timeout owns faulthandler's single timer when it is set.
    try:
        backstop = not float(item.config.getini("faulthandler_timeout") or 0)
    except ValueError:  # `-p no:faulthandler`: the ini key is not registered
        backstop = True
    hooks = item.config.pluginmanager.get_plugin(SENTINEL_PLUGIN)
    sentinel = hooks.sentinel if hooks is not None else None
    on_debugging = on_case = None
    if sentinel is not None:  # its last words come a second before faulthandler's exit
        after = watchdog.GRACE_S + watchdog.BACKSTOP_S - 1
        sentinel.backstop(session.settings.timeout + after, f"ran longer than cudaopt_timeout="
                          f"{session.settings.timeout:g}s and was still running {after:g} s later")
        on_debugging = lambda: sentinel.backstop(None)  # noqa: E731
        on_case = sentinel.case
    dog = watchdog.Watchdog(session.settings.timeout, item.nodeid, on_stuck=on_stuck, backstop=backstop,
                            on_debugging=on_debugging, on_case=on_case)
    if phase == "setup":
        dog.stage = "loading the workdir (building its extension, importing model.py and model_new.py)"
    where = ""
    try:
        with dog:
            return (yield)
    except watchdog.HangTimeout as exc:
        where = workdir_frames(exc, workdir) or "  (not in the workdir's files)"
    except BaseException as exc:
        session.note_fault(item.nodeid, exc)
        raise
    finally:
        if sentinel is not None:
            sentinel.backstop(None)
    if where:  # outside the except block: the failure alone, no exception chain
        message, setup = dog.message(), bool(dog.stage)
        session.record_hang(workdir, item.nodeid, dog.case, f"{message}\nwhere it was:\n{where}", correctness,
                            setup=setup)
        later = ("the workdir's later items that import, build or run its code fail at once (the rules that only "
                 "read its files still run)" if setup else "the later correctness and perf items of this workdir "
                 "are not run")
        pytest.fail(f"{message}\n{later}\nwhere it was:\n{where}", pytrace=False)


def _relative(filename: str, root: Path) -> str | None:
    path = Path(filename)
    if path.is_absolute() and (root == path.resolve() or root in path.resolve().parents):
        return str(path.resolve().relative_to(root))
    return None


def workdir_frames(exc: BaseException, workdir: Path) -> str:
    """The frames of `exc`'s traceback in the workdir's files, `  model.py:7 in <module>: ...`."""
    import traceback

    root = Path(workdir).resolve()
    lines = [f"  {rel}:{frame.lineno} in {frame.name}" + (f": {frame.line.strip()}" if frame.line else "")
             for frame in traceback.extract_tb(exc.__traceback__) if (rel := _relative(frame.filename, root))]
    # A hang in the workdir's worker: its stacks, as faulthandler printed them, innermost first.
    for rel, line, func, code in worker_frames(getattr(exc, "worker_stacks", ""), root):
        lines.append(f"  {rel}:{line} in {func}" + (f": {code}" if code else "") + " (in the worker)")
    return "\n".join(lines)


_FAULTHANDLER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def worker_frames(stacks: str, workdir: Path) -> list[tuple[str, int, str, str]]:
    """(path, line, function, code) of each frame in the workdir's files of a worker's faulthandler stacks."""
    root = Path(workdir).resolve()
    return [(rel, int(m["line"]), m["func"], linecache.getline(str(Path(m["file"])), int(m["line"])).strip())
            for m in _FAULTHANDLER_FRAME.finditer(stacks or "") if (rel := _relative(m["file"], root))]


def end_session(item: pytest.Item, message: str) -> None:
    """From the watchdog thread, while the main thread is stuck in `item`: report it failed and
    every later item not run, then pytest's session finish (on a pytest-xdist worker only the
    failure: the controller owns the rest)."""
    config, session = item.config, item.session
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        try:
            capman.suspend_global_capture(in_=True)
        except Exception:  # noqa: BLE001  already suspended, or never started
            pass
    if hasattr(config, "workerinput"):
        _report(config, item, "failed", message)
        return
    items = list(session.items)
    later = items[items.index(item) + 1:] if item in items else []
    report_rest(config, item, message, later, f"not run: the run ended after {item.nodeid} timed out")
    # The exit status is 1 whatever pytest counted: the watchdog exits with it.
    config.hook.pytest_sessionfinish(session=session, exitstatus=1)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def report_rest(config: pytest.Config, running: pytest.Item | None, message: str, later, reason: str) -> None:
    """Through pytest's hooks: `running` failed with `message`, each of `later` skipped with `reason`."""
    if running is not None:
        _report(config, running, "failed", message)
    for other in later:
        path, lineno, _ = other.location
        config.hook.pytest_runtest_logstart(nodeid=other.nodeid, location=other.location)
        _report(config, other, "skipped", (str(config.rootpath / path), (lineno or 0) + 1, reason), "setup")
        config.hook.pytest_runtest_logfinish(nodeid=other.nodeid, location=other.location)


def _report(config: pytest.Config, item: pytest.Item, outcome: str, longrepr, when: str = "call") -> None:
    now = time.time()
    config.hook.pytest_runtest_logreport(report=pytest.TestReport(
        item.nodeid, item.location, {name: 1 for name in item.keywords}, outcome, longrepr, when,
        start=now, stop=now))


class InterruptHooks:
    """An interrupted session ends like one the watchdog ends: the running item failed, every item
    not yet run reported as "not run", so that no report reads as a pass of fewer items."""

    def __init__(self, cudaopt):
        self.cudaopt = cudaopt
        self.session: pytest.Session | None = None
        self.started: str | None = None
        self.finished: set[str] = set()
        self.workers: dict[str, object] = {}  # node id -> the pytest-xdist worker that reported on it

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.started = nodeid

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        self.finished.add(nodeid)
        signals.raise_lost()   # an interrupt C code discarded while the item ran

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        signals.finishing()   # outermost: from here a signal no longer cuts a report short
        return (yield)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.workers[report.nodeid] = getattr(report, "node", None)  # a pytest-xdist worker's

    def _report_pending(self, config: pytest.Config, reason: str) -> None:
        """On a pytest-xdist controller: each verdict item without an outcome failed or not run."""
        for entry in self.cudaopt.ledger.pending():
            path, name = entry.test.split("::")[0], entry.test.split("::")[-1]
            now = time.time()
            outcome = ("failed", f"INTERRUPTED: {reason} while this test ran", "call") if entry.test in self.workers \
                else ("skipped", (str(config.rootpath / path), 1, f"not run: the run was {reason} before it"), "setup")
            report = pytest.TestReport(entry.test, (path, None, name), {entry.kind: 1}, *outcome, start=now, stop=now)
            if self.workers.get(entry.test) is not None:
                report.node = self.workers[entry.test]
            config.hook.pytest_runtest_logreport(report=report)

    def pytest_keyboard_interrupt(self, excinfo) -> None:
        signals.caught()
        if not self.cudaopt.ledger.entries:
            return  # no verdict item in this run: pytest's interrupt as it always is
        what = signals.reason() or (f"{excinfo.typename}: {excinfo.value}" if str(excinfo.value) else excinfo.typename)
        reason = f"interrupted by {what}"
        self.cudaopt.ledger.end(ledger.INTERRUPTED, reason)
        session = self.session
        if session is None or hasattr(session.config, "workerinput"):
            return  # interrupted before the session, or a pytest-xdist worker (its controller reports)
        if not session.items:  # a pytest-xdist controller knows the items by node id only
            self._report_pending(session.config, reason)
            return
        items = [item for item in session.items if item.nodeid not in self.finished]
        running = next((item for item in items if item.nodeid == self.started), None)
        dog = watchdog.Watchdog.last
        case = dog.case if dog is not None and running is not None and dog.test == running.nodeid else ""
        message = f"INTERRUPTED: {reason} while this test ran" + (f" on case {case}" if case else "")
        if case and dog.replay:
            message += f"\nreplay: {dog.replay}"
        report_rest(session.config, running, message, [i for i in items if i is not running],
                    f"not run: the run was {reason} before it")


class BlameHooks:
    """Writes each failed report's blame into its user properties: `blame.assign`'s, else `blame.classify`'s."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        said = [value for name, value in item.user_properties if name == blame.PROPERTY]
        item.user_properties[:] = [(n, v) for n, v in item.user_properties if n != blame.PROPERTY]
        if report.failed:
            exc = call.excinfo.value if call.excinfo is not None else None
            found = said[-1] if said else blame.classify(exc, report.longreprtext)
            report.user_properties = [*report.user_properties, (blame.PROPERTY, found)]
        return report
