"""`cudaopt gate`: one session of the three verdicts, exit codes that tell a failed verdict from a broken
setup, the summary files, and the regression check against the target branch's ModelNew."""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET

import pytest
import torch

from doubles import DOUBLES_PATH
from support import copy_workdir, run_python, subprocess_env
from pytest_cudaopt.commands import gate as ci_gate
from pytest_cudaopt import policy

MS = 1e-3
CPU_INI = """\
[pytest]
cudaopt_device = cpu
cudaopt_compile_backend = eager
cudaopt_warmup = 0.01
cudaopt_max_time = 0.5
"""
FAKE_CLOCK = DOUBLES_PATH + """\
from doubles import FakeClock


def pytest_cudaopt_perf_clock(config, device):
    return FakeClock({durations!r})
"""


def run_gate(pytester, *args, env=None):
    started = time.monotonic()
    done = run_python(["-m", "pytest_cudaopt.cli", "gate", *map(str, args)], cwd=pytester.path,
                      env={**subprocess_env(), **(env or {})}, timeout=600)
    print(done.stdout)
    print(done.stderr, file=sys.stderr)
    return pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(),
                            time.monotonic() - started)


def own_workdir(path):
    """The example CPU workdir's rules: its kernel is C++ in a .cpp file (KC005 off), locked by its owner."""
    (path / "pyproject.toml").write_text('[tool.cudaopt]\ndisable = ["KC005"]\n')
    policy.write_lock(path)
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: GPU items run")
def test_without_a_device_the_gate_is_broken_not_passed_and_writes_its_summaries(pytester):
    own_workdir(copy_workdir("cpu_scale", pytester.path / "wd"))
    step_summary = pytester.path / "step_summary.md"
    result = run_gate(pytester, "wd", "--out", "out", env={"GITHUB_STEP_SUMMARY": str(step_summary)})
    assert result.ret == ci_gate.BROKEN == 3
    result.stdout.fnmatch_lines(["cudaopt gate: exit 3 (*TestPerf::test_speedup: no CUDA device visible*"])
    summary = (pytester.path / "out" / "summary.md").read_text()
    assert summary.startswith("## cudaopt gate: BROKEN (the setup, not the candidate)\n")
    assert "- model_new.py::TestPerf::test_speedup: no CUDA device visible" in summary
    assert "- " + str((pytester.path / "wd").resolve()) + ": disabled rules KC005" in summary
    assert step_summary.read_text() == summary
    junit = ET.parse(pytester.path / "out" / "junit.xml").getroot()
    assert int(junit.find("testsuite").get("errors")) == 6  # 4 correctness + 1 memory safety + 1 perf, none skipped
    wd = (pytester.path / "wd").resolve()
    assert f"(a CPU workdir: `cudaopt gate {wd} -- --cudaopt-device=cpu`" in (pytester.path / "out" / "junit.xml").read_text()
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert report["relaxations"] and report["blame"] == "environment", report["blame"]   # no GPU: not the candidate's
    # The same under pytest-xdist: the workers' reports reach the gate on the controller.
    result = run_gate(pytester, "wd", "--out", "out", "--", "-n", "2", "-p", "no:randomly")
    assert result.ret == ci_gate.BROKEN
    assert "were collected" not in (pytester.path / "out" / "summary.md").read_text()
    assert "- model_new.py::TestPerf::test_speedup: no CUDA device visible" in (
        pytester.path / "out" / "summary.md").read_text()


def test_the_exit_code_tells_a_failed_verdict_from_a_broken_setup():
    seen = ci_gate.Observer(kinds={"policy": 22, "correctness": 4, "perf": 1})
    assert ci_gate.exit_code(0, seen) == (ci_gate.PASSED, [])
    seen.failed.append(("model_new.py::TestPolicy::test_rule[MN003]", "MN003: ..."))
    assert ci_gate.exit_code(1, seen) == (ci_gate.FAILED, ["model_new.py::TestPolicy::test_rule[MN003] failed"])
    code, reasons = ci_gate.exit_code(5, ci_gate.Observer())
    assert code == ci_gate.BROKEN
    assert reasons[0] == "no policy, correctness, perf items were collected: the gate needs all three verdicts"
    code, reasons = ci_gate.exit_code(0, ci_gate.Observer(kinds={"policy": 22, "correctness": 4}))
    assert (code, reasons) == (ci_gate.BROKEN, ["no perf items were collected: the gate needs all three verdicts"])


def test_with_a_target_branch_the_lock_must_be_the_target_branchs(tmp_path):
    candidate, target = (copy_workdir("cpu_scale", tmp_path / name) for name in ("wd", "target"))
    assert ci_gate.lock_change(candidate, None) is None
    assert ci_gate.lock_change(candidate, target) is None
    # A candidate that edits its conftest.py and relocks passes PF003 but not this.
    (candidate / "conftest.py").write_text("import pytest\n")
    policy.write_lock(candidate)
    assert all(v.rule != "PF003" for v in policy.check_workdir(candidate))
    assert "differs from the target branch's" in ci_gate.lock_change(candidate, target)


def test_gate_options_are_checked_before_anything_runs(pytester):
    result = run_gate(pytester, "nowhere")
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*nowhere is not a workdir: it has no model.py"])


@pytest.mark.slow
def test_the_gate_runs_the_three_verdicts_in_order_and_fails_on_a_regression(pytester, make_workdir, monkeypatch):
    monkeypatch.setenv("CUDAOPT_SELF_TEST", "1")  # the fake clock below decides the timings
    candidate = make_workdir("cpu_scale", dest=pytester.path / "wd")
    target = make_workdir("cpu_scale", dest=pytester.path / "target")
    for path in (candidate, target):
        (path / "pytest.ini").write_text(CPU_INI)

    def clock(**durations):  # the same conftest.py on both branches, so their locks agree
        for path in (candidate, target):
            (path / "conftest.py").write_text(FAKE_CLOCK.format(durations=durations))
            own_workdir(path)

    # Within the margin of the target branch: passes, with both ModelNew rows in the table.
    clock(custom=1.0 * MS, target=1.02 * MS, compile=2 * MS, eager=3 * MS)
    result = run_gate(pytester, "wd", "--out", "out", "--baseline-workdir", "target", "--", "-v")
    assert result.ret == ci_gate.PASSED, result.stdout.str()
    kinds = [line.split("::")[1] for line in result.outlines if "model_new.py::" in line and "PASSED" in line]
    assert kinds == sorted(kinds, key=["TestBuild", "TestPolicy", "TestCorrectness", "TestPerf"].index) and len(set(kinds)) == 4
    summary = (pytester.path / "out" / "summary.md").read_text()
    assert summary.startswith("## cudaopt gate: PASSED")
    assert "| ModelNew (target branch) | 1.02 ms |" in summary
    assert ("regression check: median(ModelNew (custom)) / median(ModelNew (target branch)) = "
            "1.00 ms / 1.02 ms = 0.980 <= 1 + 0.03: PASS") in summary
    # 10% slower than the target branch: the speed decision passes, the regression check fails it.
    clock(custom=1.1 * MS, target=1.0 * MS, compile=2 * MS, eager=3 * MS)
    result = run_gate(pytester, "wd", "--out", "out", "--baseline-workdir", "target")
    assert result.ret == ci_gate.FAILED
    summary = (pytester.path / "out" / "summary.md").read_text()
    assert summary.startswith("## cudaopt gate: FAILED (a verdict failed)")
    assert "FAIL: slower than the target branch's ModelNew by 10.0% (margin 3%)" in summary
    perf = [r for r in json.loads((pytester.path / "out" / "report.json").read_text())["results"]
            if r["kind"] == "perf"]
    assert perf[0]["data"]["regression"]["passed"] is False
    # A looser margin is a relaxation, printed as such, and lets it through.
    result = run_gate(pytester, "wd", "--out", "out", "--baseline-workdir", "target", "--regression-margin", "0.2")
    assert result.ret == ci_gate.PASSED
    assert "setting regression_margin 0.2 (default 0.03)" in (pytester.path / "out" / "summary.md").read_text()
    # A lock rewritten in the candidate's checkout fails the gate (the target branch's lock rules).
    (candidate / "peers.py").write_text("PEERS = {}\n")
    own_workdir(candidate)
    result = run_gate(pytester, "wd", "--out", "out", "--baseline-workdir", "target", "--regression-margin", "0.2")
    assert result.ret == ci_gate.FAILED
    assert "differs from the target branch's" in (pytester.path / "out" / "summary.md").read_text()
    (candidate / "peers.py").unlink()
    own_workdir(candidate)
    # A rule broken in the candidate's own files is a failed verdict, not a broken setup.
    (candidate / "kernels" / "scale_v2.cpp").write_text("// an older version\n")
    assert run_gate(pytester, "wd", "--out", "out").ret == ci_gate.FAILED
