"""One JSON line per workdir: its stages merged into one status, verdicts by kind, time by stage and the children's reports as one document."""

from __future__ import annotations

import json
import socket
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from pytest_cudaopt.results import blame
from pytest_cudaopt.results.jsonreport import cannot_write
from pytest_cudaopt.results.records import finite
from pytest_cudaopt.judge.stages import FAILED, OK, StageResult

LINE_SCHEMA = "cudaopt-judge/1"
# Line statuses: judged (every stage ran to its end; `passed` says the verdict), build-failed, crashed, timeout,
# error (could not be judged), cancelled (the judge was interrupted first).
STATUSES = ("judged", "build-failed", "crashed", "timeout", "error", "cancelled")
KINDS = ("policy", "correctness", "perf")


def merge_reports(results: Sequence[StageResult]) -> dict | None:
    """The children's JSON reports as one document: passed and complete only when every one is."""
    docs = [(r.stage, r.report) for r in results if r.report is not None]
    if not docs:
        return None
    first = docs[-1][1]
    merged: dict[str, Any] = {
        "schema": docs[0][1].get("schema"), "created": first.get("created"),
        "environment": first.get("environment"), "settings": first.get("settings"),
        "seeds": {stage: doc.get("seed") for stage, doc in docs},
        "relaxations": sorted({r for _, doc in docs for r in doc.get("relaxations", [])}),
        # what each stage's workers were confined by (the stages that started one)
        "sandbox": {stage: doc["sandbox"] for stage, doc in docs if (doc.get("sandbox") or {}).get("workers")},
        "passed": all(bool(doc.get("passed")) for _, doc in docs),
        "blame": blame.worst(doc.get("blame") for _, doc in docs),
        "results": [rec for _, doc in docs for rec in doc.get("results", [])],
        "items": [item for _, doc in docs for item in doc.get("items", [])],
        "not_passed": [test for _, doc in docs for test in doc.get("not_passed", [])],
    }
    counts: Counter = Counter()
    for _, doc in docs:
        counts.update(doc.get("counts") or {})
    merged["counts"] = dict(counts)
    early = [doc for _, doc in docs if doc.get("complete") is False]
    merged["complete"] = not early
    if early:  # the first stage that did not finish says why
        merged.update(cause=early[0].get("cause"), reason=early[0].get("reason"), running=early[0].get("running"))
    return merged


def verdicts(results: Sequence[StageResult]) -> dict[str, str]:
    """pass / FAIL / skipped / not run for each verdict kind, from the JUnit cases."""
    cases = [c for r in results for c in r.cases]
    found = {}
    for kind in [*KINDS, *sorted({c["kind"] for c in cases} - set(KINDS))]:
        mine = {c["outcome"] for c in cases if c["kind"] == kind}
        found[kind] = ("FAIL" if mine & {"failure", "error"} else "pass" if "passed" in mine
                       else "skipped" if mine else "not run")
    return found


def where_time_goes(results: Sequence[StageResult], report: dict | None) -> dict[str, float]:
    """Seconds of: build, startup (the pytest children's wall time less their items), each kind's items, and the
    torch.compile baseline's first call."""
    spent = {"build": 0.0, "startup": 0.0}
    for r in results:
        if r.stage == "build":
            spent["build"] += r.seconds
            continue
        items = sum(c["seconds"] for c in r.cases)
        spent["startup"] += max(0.0, r.seconds - items)
        for c in r.cases:
            spent[c["kind"]] = spent.get(c["kind"], 0.0) + c["seconds"]
    compiles = [rec.get("data", {}).get("compile_seconds", {}).get("compile") for rec in (report or {}).get("results", [])
                if rec.get("kind") == "perf"]
    spent["baseline_compile"] = sum(c for c in compiles if isinstance(c, (int, float)))
    return {k: round(v, 3) for k, v in spent.items()}


def status_of(results: Sequence[StageResult]) -> tuple[str, str | None]:
    """The line's status and reason: the first stage that did not end in ok or failed decides."""
    for r in results:
        if r.status not in (OK, FAILED, "not-run"):
            return r.status, r.reason
    failed = next((r for r in results if r.status == FAILED), None)
    return "judged", (f"{failed.stage}: {failed.reason}" if failed is not None else None)


def assemble(*, workdir: str, key: str, content: str, results: Sequence[StageResult],
             seconds: dict[str, float], copy: str | None = None, status: str | None = None,
             reason: str | None = None, id: Any = None) -> dict[str, Any]:
    """The line of one workdir; `copy`: the private copy's path, replaced by `workdir` in the reports."""
    found_status, found_reason = status_of(results)
    status = status or found_status
    reason = reason if reason is not None else found_reason
    report = merge_reports(results)
    ran = {r.stage for r in results if r.status != "not-run"}
    passed = (status == "judged" and all(r.status == OK for r in results) and {"build", "policy", "check", "perf"} <= ran
              and report is not None and report.get("passed") is True and report.get("complete") is not False)
    line: dict[str, Any] = {
        "schema": LINE_SCHEMA, "key": key, "id": id, "workdir": workdir, "status": status, "passed": passed,
        "blame": None if passed else blame_of(status, report), "reason": reason, "host": socket.gethostname(),
        "gpu": next((r.device for r in reversed(results) if r.device is not None), None),
        "devices": {r.stage: r.device for r in results if r.device is not None},
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "time": where_time_goes(results, report), "verdicts": verdicts(results), "content": content,
        "objects": next((r.objects for r in results if r.stage == "build"), {}),
        "stages": {r.stage: r.to_json() for r in results}, "report": report,
    }
    if copy:
        line = json.loads(dumps(line).replace(json.dumps(copy)[1:-1], json.dumps(workdir)[1:-1]))
    return line


def blame_of(status: str, report: dict | None) -> str | None:
    """Whose fault a line that did not pass is (blame.py): the reports', else the candidate's unless not judged."""
    if report is not None and report.get("blame"):
        return report["blame"]
    return "candidate" if status in ("judged", "build-failed", "crashed", "timeout") else None


def unjudged(workdir: str, key: str, status: str, reason: str, seconds: float = 0.0, id: Any = None,
             queued: float | None = None) -> dict[str, Any]:
    """The line of a workdir not judged (or cancelled): `seconds` since its submission, `queued` of them."""
    queued = seconds if queued is None else queued
    return assemble(workdir=workdir, key=key, content="", results=[], id=id, status=status, reason=reason,
                    seconds={"queued": queued, "judging": seconds - queued, "total": seconds})


def cancelled_reason(why: str, began: bool) -> str:
    """A `cancelled` line's reason: `why`, and whether the workdir's judging had begun."""
    when = "while this workdir was judged" if began else "before this workdir's judging began"
    return f"{why} {when}"


class Attempts:
    """Each workdir's lines so far, by any key: whether its latest is judged again (`judge_again(line, attempts)`,
    Options.judge_again), else that line stamped with its `attempts` and the `earlier` ones' status, blame,
    reason and seconds (for a replay of the run). The local pool's retries, the Ray driver's and a Service's
    share it."""

    def __init__(self, judge_again: Callable[[dict, int], bool]):
        self._judge_again = judge_again
        self._count: dict[Any, int] = {}
        self._earlier: dict[Any, list[dict]] = {}

    def again(self, key: Any, line: dict, allowed: bool = True) -> bool:
        count = self._count[key] = self._count.get(key, 0) + 1
        if allowed and self._judge_again(line, count):
            self._earlier.setdefault(key, []).append({k: line.get(k) for k in ("status", "blame", "reason",
                                                                                "seconds")})
            return True
        del self._count[key]
        line["attempts"] = count
        if key in self._earlier:
            line["earlier"] = self._earlier.pop(key)
        return False


def dumps(line: dict) -> str:
    """Strict JSON on one line (NaN and infinities as null)."""
    return json.dumps(finite(line), allow_nan=False, default=str, separators=(",", ":"))


def unwritable(path: Path) -> str:
    """Why the lines cannot go to `path` ("" when they can): a folder, a file of something else (never
    overwritten), a place that cannot be written. Asked before any workdir is judged."""
    if path.is_dir():
        return f"{path} is a folder"
    if path.is_file() and path.stat().st_size:
        try:
            with open(path, encoding="utf-8") as handle:
                first = json.loads(handle.readline())
        except (OSError, ValueError):
            first = None
        if not isinstance(first, dict) or first.get("schema") != LINE_SCHEMA:
            return f"{path} exists and does not hold `cudaopt judge` lines; it is left alone"
    return cannot_write(path)


def read_lines(path: Path) -> list[dict]:
    """The lines of a JSON-lines file (a torn last line, from a killed judge, is left out)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    found = []
    for raw in text.splitlines():
        try:
            found.append(json.loads(raw))
        except ValueError:
            continue
    return found


def table_rows(lines: Iterable[dict], root: Path | None = None) -> list[dict[str, str]]:
    """The final table's rows: workdir, status, verdict by kind, speedup, seconds by stage, GPU."""
    rows = []
    for line in lines:
        name = line["workdir"]
        if root is not None:
            try:
                name = str(Path(name).relative_to(root))
            except ValueError:
                pass
        stages = line.get("stages", {})
        v = line.get("verdicts", {})
        perf = [r.get("row", {}) for r in (line.get("report") or {}).get("results", []) if r.get("kind") == "perf"]
        rows.append({"workdir": name, "status": line["status"], "verdict": "PASS" if line["passed"] else "FAIL",
                     "policy": v.get("policy", "-"), "correctness": v.get("correctness", "-"),
                     "perf": v.get("perf", "-"), "vs compile": str(perf[0].get("vs compile", "-")) if perf else "-",
                     **{f"{s} s": f"{stages[s]['seconds']:.1f}" if stages.get(s, {}).get("status", "not-run") != "not-run"
                        else "-"
                        for s in ("build", "policy", "check", "perf")},
                     "gpu": str(line.get("gpu") if line.get("gpu") is not None else "-")})
    return rows
