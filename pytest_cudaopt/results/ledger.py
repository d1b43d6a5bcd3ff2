"""What the run was asked to judge and how each item ended: the account behind `passed` and `complete` in the JSON report."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from pytest_cudaopt.results import blame as blame_
from pytest_cudaopt.results.records import ACCEPTED, FAILED, NOT_RUN, PASSED, SKIPPED, STATUSES, PolicyResult

KINDS = ("build", "correctness", "perf", "policy", "memsafety")
# Item user properties: how the plugin's items say what a skip means, and which rule a policy item is.
SKIP_PROPERTY = "cudaopt_skip_status"
RULE_PROPERTY = "cudaopt_rule"
# How the session ended early (`Account.cause`).
INTERRUPTED, TIMEOUT, CRASH, STOPPED, INTERNAL_ERROR, RUNNING = (
    "interrupted", "timeout", "crash", "stopped", "internal error", "running")
# Not complete for a failure that is not the candidate's (blame.py): the item's blame is the cause.
ENVIRONMENT, HARNESS = blame_.ENVIRONMENT, blame_.HARNESS
# The suite's classes (suite/items.py): a pytest-xdist controller knows its items by node id only.
_SUITE_KINDS = {"TestBuild": "build", "TestCorrectness": "correctness", "TestPerf": "perf", "TestPolicy": "policy",
                "TestMemorySafety": "memsafety"}
_SUITE_RULES = {"test_extension_functions": "EX001"}  # policy items not parametrized by rule
_MAX_TEXT_LINES = 60


def kind_of(nodeid: str, keywords: Iterable[str] = ()) -> str | None:
    """The verdict kind of an item, from its markers (`keywords`) or its suite class."""
    keywords = set(keywords)
    for kind in KINDS:
        if kind in keywords:
            return kind
    return next((_SUITE_KINDS[p] for p in nodeid.split("[")[0].split("::")[1:] if p in _SUITE_KINDS), None)


def rule_of(nodeid: str, properties: dict[str, Any]) -> str:
    """A policy item's rule id: its property, its parameter (`test_rule[PF003]`) or its name."""
    if properties.get(RULE_PROPERTY):
        return str(properties[RULE_PROPERTY])
    found = re.search(r"\[([A-Z]{2}\d{3})\]$", nodeid)
    name = nodeid.split("::")[-1]
    return found.group(1) if found else _SUITE_RULES.get(name, name)


def first_line(text: str) -> str:
    """The first line worth showing of a pytest failure text (xdist's `[gw0] ...` header skipped)."""
    lines = [line.strip() for line in text.strip().splitlines()
             if line.strip() and not re.match(r"\[gw\d+\] ", line.strip())]
    return lines[0].removesuffix(":") if lines else ""


@dataclass
class Entry:
    """One verdict item: what it is and how it ended (so far)."""

    test: str
    kind: str
    workdir: str
    status: str = NOT_RUN
    reason: str = ""
    text: str = ""             # a failure's full text (a policy item's violations)
    rule: str = ""             # a policy item's rule id
    blame: str | None = None   # whose fault it is that it did not pass (blame.py)

    def to_json(self) -> dict[str, Any]:
        out = {"test": self.test, "kind": self.kind, "workdir": self.workdir, "status": self.status,
               "reason": self.reason, "blame": self.blame}
        if self.kind == "policy":
            out["rule"] = self.rule
        return out


@dataclass
class Account:
    """The decided state of a run: what `passed` and `complete` say, and why."""

    passed: bool
    complete: bool
    cause: str | None                  # how the session ended early, None when complete
    reason: str                        # why it is not complete ("" when complete)
    running: str | None                # the item running when the account was taken
    not_passed: list[str]              # every reason `passed` is false
    items: list[Entry]
    counts: dict[str, int] = field(default_factory=dict)
    blame: str | None = None           # whose fault it is that it did not pass (blame.worst of the items')


class Ledger:
    """Every verdict item of the run, entered at collection and updated from pytest's reports."""

    def __init__(self, asked: str = ""):
        self.asked = asked or ""       # the -m expression
        self.entries: dict[str, Entry] = {}
        self.running: str | None = None
        self.ended: tuple[str, str] | None = None   # (cause, reason) of an early end

    def collect(self, test: str, kind: str | None, workdir: str, rule: str = "") -> None:
        if kind in KINDS and test not in self.entries:
            self.entries[test] = Entry(test, kind, workdir, rule=rule or (rule_of(test, {}) if kind == "policy" else ""))

    def start(self, test: str) -> None:
        if self.ended is None:  # after the end, the rest is reported as not run: none of it runs
            self.running = test

    def report(self, test: str, kind: str | None, workdir: str, when: str, outcome: str, text: str,
               properties: dict[str, Any] | None = None) -> None:
        """One of pytest's reports on an item ("???" for a crashed pytest-xdist worker's item)."""
        properties = properties or {}
        self.collect(test, kind, workdir)
        entry = self.entries.get(test)
        if entry is None:
            return
        if entry.kind == "policy":
            entry.rule = rule_of(test, properties)
        if outcome == "failed":
            if entry.status in (PASSED, NOT_RUN) or not entry.reason:
                line = _violation(text) if entry.kind == "policy" else first_line(text)
                if properties.get(blame_.PROPERTY) in (HARNESS, ENVIRONMENT):  # a traceback: its exception's line
                    line = _exception_line(text) or line
                line = line or f"failed at {when}"
                entry.status = NOT_RUN if line.startswith("not run") else FAILED
                entry.reason, entry.text = line, _cut(text)
                # A failure recorded once the run was interrupted (the item that was running) is nobody's.
                interrupted = self.ended is not None and self.ended[0] == INTERRUPTED
                entry.blame = None if interrupted else properties.get(blame_.PROPERTY) or blame_.CANDIDATE
        elif outcome == "skipped":
            if entry.status in (PASSED, NOT_RUN):
                entry.reason = text.strip() or "skipped"
                not_run = entry.reason.startswith("not run")  # the run ended before it
                entry.status = NOT_RUN if not_run else properties.get(SKIP_PROPERTY) or SKIPPED
        elif when in ("call", "???") and entry.status == NOT_RUN:
            entry.status, entry.reason = PASSED, ""
        if when == "teardown" and self.running == test:
            self.running = None

    def pending(self) -> list[Entry]:
        """The items pytest has not reported an outcome for yet."""
        return [entry for entry in self.entries.values() if entry.status == NOT_RUN and not entry.reason]

    def end(self, cause: str, reason: str) -> None:
        """The session ended early; the first cause given is kept."""
        if self.ended is None:
            self.ended = (cause, reason)

    def account(self, results: Sequence[Any] = (), running: str | None = None) -> Account:
        """The run's account now. `running`: taken before that item ran, while the session goes on."""
        cause, reason = self.ended if self.ended is not None else (None, "")
        blamed = [e for e in self.entries.values() if e.status not in ACCEPTED and e.blame in (ENVIRONMENT, HARNESS)]
        if blamed and cause is None:  # not the candidate's: no verdict
            cause = blame_.worst(e.blame for e in blamed)
            first = next(e for e in blamed if e.blame == cause)
            reason = f"{first.test} failed for the {cause}'s sake, not the candidate's: {first.reason}"
        if running is not None and cause is None:
            cause, reason = RUNNING, (f"written before {running} ran; the session had not finished (if this is "
                                      "the last report, the process ended while that item ran)")
        items = [self._settled(entry, running, reason) for entry in self.entries.values()]
        not_passed = []
        if cause is not None:
            not_passed.append(f"the session did not complete: {reason}")
        if not items:
            not_passed.append("no verdict item (build, correctness, perf, policy, memsafety) was collected")
        for kind in asked_kinds(self.asked):
            if not any(item.kind == kind for item in items):
                not_passed.append(f"-m {self.asked!r} asks for {kind} verdicts, but no {kind} item was collected")
        not_passed += _grouped([item for item in items if item.status not in ACCEPTED])
        failed = {item.test for item in items if item.status not in ACCEPTED}
        not_passed += [f"{getattr(r, 'test', None) or r.kind}: the {r.kind} result failed" for r in results
                       if not r.passed and getattr(r, "test", None) not in failed]
        counts = {status: sum(1 for item in items if item.status == status) for status in STATUSES}
        blame = blame_.worst(item.blame for item in items if item.status not in ACCEPTED)
        if cause == INTERNAL_ERROR:
            blame = HARNESS
        elif cause in (TIMEOUT, CRASH) and blame is None:
            blame = blame_.CANDIDATE
        return Account(passed=not not_passed, complete=cause is None, cause=cause, reason=reason,
                       running=running if running is not None else (self.running if cause else None),
                       not_passed=not_passed, items=items, counts={k: n for k, n in counts.items() if n},
                       blame=None if not not_passed else blame)

    def _settled(self, entry: Entry, running: str | None, reason: str) -> Entry:
        """The entry as the account shows it: an item that never ended says why."""
        if entry.status != NOT_RUN or entry.reason:
            return entry
        if self.ended is not None:
            why = (f"it was running when the session ended ({reason})" if entry.test == self.running
                   else f"the session ended before it ({reason})")
        elif running is not None:
            why = ("running when this report was written" if entry.test == running
                   else "not reached when this report was written")
        else:
            why = "pytest never reported on it"
        return replace(entry, reason=f"not run: {why}")


def policy_results(items: Iterable[Entry]) -> list[PolicyResult]:
    """One policy result per workdir, from its policy items."""
    found: dict[str, PolicyResult] = {}
    for item in items:
        if item.kind != "policy":
            continue
        result = found.setdefault(item.workdir, PolicyResult(workdir=item.workdir))
        result.rules[item.rule] = item.status
        if item.status not in ACCEPTED or item.reason:
            result.reasons[item.rule] = item.reason
        if item.status == FAILED:
            result.violations += [line for line in item.text.splitlines()[1:] if line.strip()] or [item.reason]
    return list(found.values())


def asked_kinds(expression: str) -> list[str]:
    """The verdict kinds a `-m` expression names without `not` before them."""
    tokens = re.findall(r"[\w.]+|[()]", expression or "")
    return [t for i, t in enumerate(tokens) if t in KINDS and (i == 0 or tokens[i - 1] != "not")]


def _grouped(items: Sequence[Entry]) -> list[str]:
    """One line per item that did not pass; items that share a reason share one line."""
    groups: dict[tuple[str, str], list[str]] = {}
    for item in items:
        groups.setdefault((item.status, item.reason), []).append(item.test)
    lines = []
    for (status, reason), tests in groups.items():
        said = reason if reason.startswith(status) else f"{status}: {reason}"
        if len(tests) == 1:
            lines.append(f"{tests[0]}: {said}")
        else:
            lines.append(f"{len(tests)} items, {said}: {', '.join(tests[:3])}" + (", ..." if len(tests) > 3 else ""))
    return lines


def _exception_line(text: str) -> str:
    """The first line of a traceback's last exception (pytest's last block of `E ` lines), or ""."""
    blocks = re.findall(r"(?:^E .*(?:\n|$))+", text, re.M)
    return blocks[-1].splitlines()[0][1:].strip() if blocks else ""


def _violation(text: str) -> str:
    """A policy failure's first violation (`path:line: RULE: ...`); the first line of any other failure."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or not re.match(r".+?:\d+: [A-Z]{2}\d{3}: ", lines[1]):
        return first_line(text)
    return lines[1] + (f" (and {len(lines) - 2} more)" if len(lines) > 2 else "")


def _cut(text: str) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:_MAX_TEXT_LINES] + (["..."] if len(lines) > _MAX_TEXT_LINES else []))


class LedgerHooks:
    """The pytest hooks that feed a ledger every verdict item's reports (pytest-xdist workers' too)."""

    def __init__(self, ledger: Ledger, workdir_of):
        self.ledger = ledger
        self.workdir_of = workdir_of

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.ledger.start(nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        skip = report.longrepr if report.skipped and isinstance(report.longrepr, tuple) else None
        text = str(skip[2]).removeprefix("Skipped: ") if skip else report.longreprtext
        self.ledger.report(report.nodeid, kind_of(report.nodeid, report.keywords), self.workdir_of(report.nodeid),
                           report.when, report.outcome, text, dict(report.user_properties))
