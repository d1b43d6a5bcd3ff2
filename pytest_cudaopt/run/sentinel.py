"""The run's last words when the pytest process dies before its session finishes.

A C/C++ loop that holds the GIL and a crash leave Python no last word. The sentinel, a process
beside pytest that hears each item's start, case and outcome through a pipe, then writes the
`--junitxml` file, amends the JSON report and prints a summary; past the backstop it ends a pytest
still alive with SIGABRT. It imports only the standard library.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from xml.etree import ElementTree as ET

KILL_AFTER_S = 5.0   # past the backstop, the time the process gets to end by itself
TERM_GRACE_S = 30.0  # after a SIGTERM, the time pytest gets to end its session


class Sentinel:
    """The plugin's end of the pipe. Every method is safe to call after the sentinel died."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc
        self._lock = threading.Lock()  # the watchdog thread sends too

    @classmethod
    def start(cls, *, items: list[dict], junit: str | None, suite: str, stderr_fd: int | None,
              report: str | None = None) -> "Sentinel | None":
        # By module name, with the package's folder first on the path: run as a file, its
        # folder would shadow standard modules (trace.py).
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))
        try:
            proc = subprocess.Popen([sys.executable, "-m", "pytest_cudaopt.run.sentinel", str(os.getpid())],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=stderr_fd if stderr_fd is not None else None,
                                    env={**os.environ, "PYTHONPATH": path})
        except OSError:
            return None
        sentinel = cls(proc)
        sentinel.send({"items": items, "junit": junit, "suite": suite, "report": report})
        return sentinel

    def send(self, message: dict) -> None:
        with self._lock:
            if self._proc.stdin is None or self._proc.stdin.closed:
                return
            try:
                self._proc.stdin.write((json.dumps(message) + "\n").encode())
                self._proc.stdin.flush()
            except (OSError, ValueError):  # the sentinel is gone: nothing to tell
                pass

    def case(self, text: str, replay: str = "") -> None:
        self.send({"case": text, "replay": replay})

    def backstop(self, seconds: float | None, why: str = "") -> None:
        """The running item ends within `seconds` (None: no limit); `why` says what it means."""
        self.send({"backstop": seconds, "why": why})

    def finish(self) -> None:
        """The session finished: the sentinel exits without writing anything."""
        self.send({"done": True})
        with self._lock:
            try:
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def junit_names(nodeid: str, prefix: str | None = None) -> dict:
    """An item's classname and name as pytest's JUnit file writes them."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    names[-1] += bracket + params
    classname = ".".join(names[:-1])
    return {"nodeid": nodeid, "classname": f"{prefix}.{classname}" if prefix else classname, "name": names[-1]}


@dataclass
class Outcome:
    kind: str = "passed"     # passed, failed (call), error (setup/teardown), skipped
    message: str = ""
    text: str = ""
    duration: float = 0.0


@dataclass
class Run:
    items: list[dict] = field(default_factory=list)   # nodeid, classname, name, in run order
    junit: str | None = None
    suite: str = "pytest"
    report: str | None = None          # the JSON report, rewritten before each judged item
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    running: str | None = None
    case: str = ""                     # the running item's case and its replay command
    replay: str = ""
    started_at: float = 0.0
    backstop_at: float | None = None   # monotonic time by which the running item must end
    why: str = ""

    def apply(self, message: dict) -> None:
        if "items" in message:
            self.items, self.junit, self.suite = message["items"], message.get("junit"), message.get("suite") or "pytest"
            self.report = message.get("report")
        elif "start" in message:
            self.running, self.started_at, self.backstop_at = message["start"], time.monotonic(), None
            self.case, self.replay = "", ""
            self.outcomes.setdefault(self.running, Outcome())
        elif "case" in message:
            self.case, self.replay = message["case"] or "", message.get("replay") or ""
        elif "backstop" in message:
            seconds, self.why = message["backstop"], message.get("why") or "its time limit"
            self.backstop_at = None if seconds is None else time.monotonic() + float(seconds)
        elif "report" in message:
            self._report(message)

    def _report(self, m: dict) -> None:
        outcome = self.outcomes.setdefault(m["report"], Outcome())
        outcome.duration += float(m.get("duration") or 0.0)
        text = m.get("text") or ""
        last_line = (text.strip().splitlines() or [""])[-1]  # a traceback's "E   ..." line, a skip's reason
        if m["outcome"] == "failed" and outcome.kind in ("passed", "skipped"):
            outcome.kind = "failed" if m["when"] == "call" else "error"
            outcome.message, outcome.text = last_line, text
        elif m["outcome"] == "skipped" and outcome.kind == "passed":
            outcome.kind, outcome.message, outcome.text = "skipped", last_line, text
        if m["when"] == "teardown" and self.running == m["report"]:
            self.running, self.backstop_at = None, None

    def cause(self, cause: str) -> str:
        """`cause` with the running item's case and how to replay it alone, when it said."""
        case = f"\ncase: {self.case}" if self.case else ""
        replay = f"\nreplay: {self.replay}" if self.replay else ""
        return f"{cause}{case}{replay}"

    def end(self, cause: str) -> list[tuple[dict, Outcome]]:
        """Every item with its final outcome, after the process ended for `cause`."""
        rows = []
        for item in self.items:
            nodeid = item["nodeid"]
            if nodeid == self.running:
                done = self.outcomes.get(nodeid, Outcome())
                text = self.cause(cause)
                message = f"{cause} (case: {self.case})" if self.case else cause
                outcome = Outcome("failed", message, f"{text}\n{done.text}".rstrip(),
                                  time.monotonic() - self.started_at)
            elif nodeid in self.outcomes:
                outcome = self.outcomes[nodeid]
            else:
                where = f" while {self.running} ran" if self.running else ""
                reason = f"not run: the pytest process ended{where}"
                outcome = Outcome("skipped", reason, reason)
            rows.append((item, outcome))
        return rows


def junit_xml(run: Run, rows: list[tuple[dict, Outcome]]) -> bytes:
    """A JUnit file in pytest's layout (testsuites/testsuite/testcase, failure/error/skipped)."""
    counts = {kind: sum(1 for _, o in rows if o.kind == kind) for kind in ("failed", "error", "skipped")}
    suites = ET.Element("testsuites", name="pytest tests")
    suite = ET.SubElement(suites, "testsuite", name=run.suite, errors=str(counts["error"]),
                          failures=str(counts["failed"]), skipped=str(counts["skipped"]), tests=str(len(rows)),
                          time=f"{sum(o.duration for _, o in rows):.3f}",
                          timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          hostname=socket.gethostname())
    for item, outcome in rows:
        case = ET.SubElement(suite, "testcase", classname=item["classname"], name=item["name"],
                             time=f"{outcome.duration:.3f}")
        tag = {"failed": "failure", "error": "error", "skipped": "skipped"}.get(outcome.kind)
        if tag is not None:
            child = ET.SubElement(case, tag, message=outcome.message)
            child.text = outcome.text
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def summary(rows: list[tuple[dict, Outcome]], junit: str | None) -> str:
    counts = Counter(outcome.kind for _, outcome in rows)
    lines = ["\ncudaopt: the pytest process ended before its session finished; what remains, from the sentinel:"]
    for item, o in rows:
        if o.kind in ("failed", "error"):
            lines.append(f"  {o.kind.upper()} {item['nodeid']}: {o.message}")
            lines += [f"    {line}" for line in o.text.splitlines() if line.startswith("replay: ")][:1]
    not_run = sum(1 for _, o in rows if o.message.startswith("not run"))
    lines.append("cudaopt: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
                 + (f" ({not_run} of the skipped not run)" if not_run else ""))
    if junit:
        lines.append(f"cudaopt: JUnit file written to {junit} by the sentinel")
    return "\n".join(lines) + "\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


_STATUS = {"passed": "passed", "failed": "failed", "error": "failed", "skipped": "skipped"}


def amend_report(run: Run, cause: str, kind: str) -> None:
    """Bring the JSON report up to date after the process ended for `cause` (`kind`: crash, timeout, interrupted)."""
    if not run.report:
        return
    try:
        with open(run.report, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return  # not written yet (no judged item started), or not a report: nothing to amend
    if not isinstance(doc, dict) or doc.get("cause") != "running":
        return  # the session's own final report
    reason = run.cause(cause).replace("\n", "; ")
    where = f" while {run.running} ran" if run.running else ""
    doc.update(passed=False, complete=False, cause=kind, reason=reason, running=run.running,
               blame="candidate" if kind in ("crash", "timeout") else None)
    for item in doc.get("items", []):
        if item.get("status") != "not run":
            continue
        if item.get("test") == run.running:
            item.update(status="failed", reason=reason)
        elif item.get("test") in run.outcomes:
            outcome = run.outcomes[item["test"]]
            item.update(status=_STATUS.get(outcome.kind, "failed"), reason=outcome.message)
        else:
            item["reason"] = f"not run: the pytest process ended{where}"
    doc["not_passed"] = [f"the session did not complete: {reason}"] + [
        f"{item['test']}: {item['status']}: {item['reason']}" for item in doc.get("items", [])
        if item.get("status") not in ("passed", "disabled", "not applicable")]
    doc["counts"] = dict(Counter(item["status"] for item in doc.get("items", [])))
    try:
        _replace(run.report, (json.dumps(doc, indent=2) + "\n").encode())
    except OSError as exc:
        sys.stderr.write(f"cudaopt: the sentinel could not amend {run.report}: {exc}\n")


def _replace(path: str, data: bytes) -> None:
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)


def _write_last_words(run: Run, cause: str, kind: str) -> None:
    amend_report(run, cause, kind)
    rows = run.end(cause)
    if run.junit and rows:
        try:
            _replace(run.junit, junit_xml(run, rows))
        except OSError as exc:
            sys.stderr.write(f"cudaopt: the sentinel could not write {run.junit}: {exc}\n")
            run.junit = None
    sys.stderr.write(summary(rows, run.junit))
    sys.stderr.flush()


_terminated_at: list[float] = []  # when SIGTERM reached the sentinel


def watch(parent: int, stream: Any = None) -> int:
    """Read the plugin's messages until "done" (0), else write the last words (1)."""
    fd = (stream or sys.stdin.buffer).fileno()
    run, buffer = Run(), b""
    while True:
        ends = [t for t in (run.backstop_at, _terminated_at[0] + TERM_GRACE_S if _terminated_at else None) if t]
        # At most a second: a SIGTERM's handler cannot wake a select() that Python resumes.
        wait = min([1.0] + [max(0.0, t - time.monotonic()) for t in ends])
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready and _terminated_at and time.monotonic() >= _terminated_at[0] + TERM_GRACE_S:
            _write_last_words(run, f"TERMINATED: SIGTERM, and pytest had not ended its session {TERM_GRACE_S:g} s "
                                   "later", "interrupted")
            return 1
        if not ready and run.backstop_at is not None and time.monotonic() >= run.backstop_at:
            # the backstop passed: the item holds the GIL, or nothing ends it
            cause = (f"TIMEOUT: {run.why}: a C/C++ loop that holds the GIL, which the watchdog cannot "
                     f"interrupt; faulthandler prints every stack on stderr")
            _write_last_words(run, cause, "timeout")
            deadline = time.monotonic() + KILL_AFTER_S
            while _alive(parent) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(parent):
                sys.stderr.write(f"cudaopt: ending pytest (pid {parent}) with SIGABRT: nothing else ends it\n")
                os.kill(parent, signal.SIGABRT)
            return 1
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            _write_last_words(run, "CRASH: the pytest process ended while this test ran: a segfault, an "
                                   "abort, a kill, or faulthandler's exit after a hang; see its stderr", "crash")
            return 1
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            message = json.loads(line)
            if message.get("done"):
                return 0
            run.apply(message)


def _on_sigterm(signum, frame) -> None:
    if not _terminated_at:
        _terminated_at.append(time.monotonic())


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is pytest's to handle; its "done" follows
    # A SIGTERM to the process group is pytest's too: it ends its session and says "done".
    signal.signal(signal.SIGTERM, _on_sigterm)
    return watch(int(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
