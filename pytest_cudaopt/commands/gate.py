"""The CI gate: one pytest session (policy, correctness, perf), its exit code and its summary files."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

# Exit codes of `cudaopt gate` (docs/results.md): a failed verdict is the candidate's; a broken setup the runner's.
PASSED = 0        # every verdict passed (and no regression against the target branch)
FAILED = 1        # a verdict failed: a rule, correctness, the speed decision or the regression check
USAGE = 2         # bad arguments (argparse's, or pytest's usage error), or interrupted (Ctrl-C, SIGTERM)
BROKEN = 3        # the setup is broken: no CUDA device, a verdict kind not collected, pytest error
HARNESS = 70      # no verdict: a bug of the judge's (blame.py; EX_SOFTWARE)
ENVIRONMENT = 75  # no verdict: the machine could not run a case (device busy, memory held by others): run it again
KINDS = ("policy", "correctness", "perf")
SETUP_PROPERTY = "cudaopt_setup_broken"  # user property of an item that failed for the runner's sake


@dataclass(eq=False)  # hashable: pytest keeps plugins in sets
class Observer:
    """A pytest plugin object that records what the gate needs to decide its exit code."""

    kinds: dict[str, int] = field(default_factory=dict)
    failed: list[tuple[str, str]] = field(default_factory=list)     # (node id, failure text)
    broken: list[tuple[str, str]] = field(default_factory=list)     # (node id, why)
    counts: dict[str, int] = field(default_factory=dict)

    def pytest_runtest_logreport(self, report) -> None:
        # From the reports, not the collection: a pytest-xdist controller collects nothing.
        if report.when == "setup":
            for kind in KINDS:
                if kind in report.keywords:
                    self.kinds[kind] = self.kinds.get(kind, 0) + 1
        from pytest_cudaopt.remote.worker import REQUIRE_REFUSED

        broken = dict(report.user_properties).get(SETUP_PROPERTY)
        if report.failed and not broken and REQUIRE_REFUSED in report.longreprtext:
            broken = "this runner's kernel cannot confine the candidate (cudaopt_sandbox=require: no Landlock)"
        if broken and report.failed:
            self.broken.append((report.nodeid, broken))
        elif report.failed:
            self.failed.append((report.nodeid, report.longreprtext))
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1


def lock_change(workdir: Path, baseline_workdir: Path | None) -> str | None:
    """Why the candidate's cudaopt.lock cannot be trusted, or None: the candidate could rewrite its own lock,
    so with a target branch the lock must be the target branch's, byte for byte."""
    if baseline_workdir is None:
        return None
    mine, theirs = Path(workdir) / "cudaopt.lock", Path(baseline_workdir) / "cudaopt.lock"
    if not theirs.is_file():
        return None  # the target branch has no lock yet: PF002 judges the candidate's
    if not mine.is_file() or mine.read_bytes() != theirs.read_bytes():
        return (f"{mine} differs from the target branch's {theirs}: a change to the locked files "
                "(model.py, conftest.py, peers.py, utils/, the cudaopt settings) needs the owner's "
                "review; run the gate with --allow-lock-change for such a pull request")
    return None


def exit_code(pytest_status: int, observer: Observer) -> tuple[int, list[str]]:
    """The gate's exit code and the reasons for it, from pytest's status and what was seen."""
    if pytest_status == 4:
        return USAGE, ["pytest refused its arguments (a usage error: see its message above)"]
    if pytest_status == 2:
        return USAGE, ["the run was interrupted (Ctrl-C, SIGINT or SIGTERM); its reports say how far it got"]
    reasons = []
    missing = [k for k in KINDS if not observer.kinds.get(k)]
    if missing:
        reasons.append(f"no {', '.join(missing)} items were collected: the gate needs all three verdicts")
    reasons += [f"{node}: {why}" for node, why in observer.broken]
    if pytest_status not in (0, 1, ENVIRONMENT, HARNESS):
        reasons.append(f"pytest ended with status {pytest_status} (internal error or nothing collected)")
    if reasons:
        return BROKEN, reasons
    if pytest_status in (ENVIRONMENT, HARNESS):  # the plugin's status for a failure that is not the candidate's
        who = "the environment (run it again)" if pytest_status == ENVIRONMENT else "the harness (a bug of the judge's)"
        return pytest_status, [f"{node} failed for the sake of {who}" for node, _ in observer.failed] or [who]
    if pytest_status == 1 or observer.failed:
        return FAILED, [f"{node} failed" for node, _ in observer.failed]
    return PASSED, []


def report_disagrees(report_path: Path) -> list[str]:
    """Why the JSON report does not say passed, or that there is none: the gate never passes against it."""
    from pytest_cudaopt.results import jsonreport

    try:
        doc = jsonreport.read(report_path)
    except ValueError as exc:
        return [f"the JSON report is missing or unreadable: {exc}"]
    return [] if doc.get("passed") else [f"the JSON report says not passed: {r}" for r in doc.get("not_passed", [])]


def summary_markdown(code: int, reasons: Sequence[str], observer: Observer, report_path: Path,
                     relaxations: Sequence[str]) -> str:
    """The job summary: the outcome, why, the relaxations, the verdict tables and each failure's first lines."""
    from pytest_cudaopt.results import jsonreport

    title = {PASSED: "PASSED", FAILED: "FAILED (a verdict failed)", BROKEN: "BROKEN (the setup, not the candidate)",
             USAGE: "NOT RUN (bad arguments, or interrupted)", ENVIRONMENT: "NO VERDICT (the environment: run it again)",
             HARNESS: "NO VERDICT (a bug of the harness)"}
    counts = ", ".join(f"{n} {k}" for k, n in sorted(observer.counts.items()))
    out = [f"## cudaopt gate: {title.get(code, code)}", "", f"exit code {code}; items: {counts or 'none'}", ""]
    out += [f"- {line}" for line in reasons]
    if relaxations:
        out += ["", f"**Relaxations in force ({len(relaxations)}):**", ""] + [f"- {r}" for r in relaxations]
    if report_path.is_file():
        out += ["", jsonreport.render_file(report_path, fmt="markdown")]
    for node, text in observer.failed:
        lines = text.strip().splitlines()
        out += ["", f"<details><summary>{node}</summary>", "", "```",
                *lines[:40], *(["..."] if len(lines) > 40 else []), "```", "</details>"]
    return "\n".join(out) + "\n"


def run(workdir: Path, *, out: Path, baseline_workdir: Path | None = None, regression_margin: float | None = None,
        pytest_args: Sequence[str] = (), allow_lock_change: bool = False) -> int:
    """The gate's exit code on `workdir`; report.json, junit.xml and summary.md in `out` ($GITHUB_STEP_SUMMARY)."""
    from pytest_cudaopt.launch import run_pytest, strict_sandbox
    from pytest_cudaopt.suite.settings import workdir_ini

    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "report.json"
    report_path.unlink(missing_ok=True)
    args = [str(workdir / "model_new.py"), "--rootdir", str(workdir), "-p", "no:cacheprovider", "--cudaopt-ci-gate",
            f"--cudaopt-report={report_path}", f"--junitxml={out / 'junit.xml'}", "-o", "junit_family=xunit2"]
    if baseline_workdir is not None:
        args.append(f"--cudaopt-baseline-workdir={baseline_workdir}")
    if regression_margin is not None:
        args.append(f"--cudaopt-regression-margin={regression_margin}")
    observer = Observer()
    # On a GPU runner the gate refuses a candidate that Landlock cannot confine.
    args += strict_sandbox(pytest_args, ini=workdir_ini(workdir)[1])
    code, reasons = exit_code(run_pytest([*args, *pytest_args], plugins=[observer]), observer)
    if code == PASSED:
        reasons = report_disagrees(report_path)
        code = BROKEN if reasons else PASSED
    changed = None if allow_lock_change else lock_change(workdir, baseline_workdir)
    if changed:
        code = FAILED if code == PASSED else code
        reasons.append(changed)
    relaxations = json.loads(report_path.read_text()).get("relaxations", []) if report_path.is_file() else []
    text = summary_markdown(code, reasons, observer, report_path, relaxations)
    (out / "summary.md").write_text(text)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(text)
    print(f"cudaopt gate: exit {code} ({'; '.join(reasons) or 'all verdicts passed'}); "
          f"summary, report.json and junit.xml in {out}")
    return code
