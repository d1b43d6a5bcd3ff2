"""The JSON report never lies: `passed` only when every verdict asked for ran and passed, policy records, skipped and not run items, the report path checked at the start, the schema's versions, and exit codes that match what is printed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from support import run_python, subprocess_env, TEMPLATES

from pytest_cudaopt import classic
from pytest_cudaopt.results import jsonreport, records as results
from pytest_cudaopt.cli import main as cli_main
from pytest_cudaopt.results.ledger import Ledger, asked_kinds
from pytest_cudaopt.results.records import CorrectnessResult

CPU_INI = "[pytest]\ncudaopt_device = cpu\n"
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: GPU items run")
ITEM = "wd/model_new.py::TestCorrectness::test_canonical[seed0]"


def assert_not_passed(doc: dict, *expected: str) -> None:
    """What a consumer reading only `passed` sees, and that the report says why."""
    assert doc["schema"] == "cudaopt-report/2"
    assert doc["passed"] is False, doc["not_passed"]
    assert doc["not_passed"], "a report that does not pass says why"
    for text in expected:
        assert any(text in line for line in doc["not_passed"]), (text, doc["not_passed"])


def read_report(path) -> dict:
    return json.loads(path.read_text())


# -- the account, without pytest -------------------------------------------------------------

def test_nothing_judged_is_not_a_pass():
    account = Ledger().account([])
    assert not account.passed and account.complete
    assert account.not_passed == ["no verdict item (build, correctness, perf, policy, memsafety) was collected"]


def test_a_skipped_item_fails_the_account_and_a_disabled_rule_or_an_item_with_nothing_to_judge_does_not():
    ledger = Ledger()
    ledger.report("wd/model_new.py::TestPolicy::test_rule[KC005]", "policy", "/wd", "call", "skipped",
                  "KC005 is disabled", {"cudaopt_skip_status": results.DISABLED})
    ledger.report("wd/model_new.py::TestCorrectness::test_drawn_shapes", "correctness", "/wd", "call", "skipped",
                  "no drawn shapes", {"cudaopt_skip_status": results.NOT_APPLICABLE})
    ledger.report(ITEM, "correctness", "/wd", "call", "passed", "")
    assert ledger.account().passed
    ledger.report("wd/model_new.py::TestPerf::test_speedup", "perf", "/wd", "setup", "skipped",
                  "no CUDA device visible")
    account = ledger.account()
    assert not account.passed
    assert account.not_passed == ["wd/model_new.py::TestPerf::test_speedup: skipped: no CUDA device visible"]
    assert account.counts == {"passed": 1, "skipped": 1, "disabled": 1, "not applicable": 1}


def test_items_failed_for_one_reason_share_a_line_without_a_doubled_colon():
    ledger = Ledger()
    mismatch = "model_new.py: ModelNew's output differs from Model's (model.py):\noutput: 19 of 48 elements ..."
    for seed in (1, 2):
        ledger.report(f"wd/model_new.py::TestCorrectness::test_canonical[seed{seed}]", "correctness", "/wd", "call",
                      "failed", mismatch)
    [line] = ledger.account().not_passed
    assert line == ("2 items, failed: model_new.py: ModelNew's output differs from Model's (model.py): "
                    "wd/model_new.py::TestCorrectness::test_canonical[seed1], "
                    "wd/model_new.py::TestCorrectness::test_canonical[seed2]")


def test_items_that_never_ran_are_not_run_with_the_reason():
    ledger = Ledger()
    for test in (ITEM, "wd/model_new.py::TestPerf::test_speedup"):
        ledger.collect(test, "correctness" if "Correctness" in test else "perf", "/wd")
    ledger.start(ITEM)
    early = ledger.account(running=ITEM)
    assert not early.passed and not early.complete and early.cause == "running" and early.running == ITEM
    assert [i.reason for i in early.items] == ["not run: running when this report was written",
                                               "not run: not reached when this report was written"]
    ledger.end("interrupted", "interrupted by SIGTERM")
    ended = ledger.account()
    assert (ended.complete, ended.cause, ended.running) == (False, "interrupted", ITEM)
    assert [i.reason for i in ended.items] == [
        "not run: it was running when the session ended (interrupted by SIGTERM)",
        "not run: the session ended before it (interrupted by SIGTERM)"]


def test_a_mark_expression_that_asks_for_a_verdict_with_no_item_is_not_passed():
    assert asked_kinds("correctness or (perf and not policy)") == ["correctness", "perf"]
    assert asked_kinds("not perf") == []
    ledger = Ledger("correctness or perf")
    ledger.report(ITEM, "correctness", "/wd", "call", "passed", "")
    assert ledger.account().not_passed == [
        "-m 'correctness or perf' asks for perf verdicts, but no perf item was collected"]


def test_a_failed_result_fails_the_account_even_when_its_item_passed():
    ledger = Ledger()
    ledger.report(ITEM, "correctness", "/wd", "call", "passed", "")
    failed = CorrectnessResult(workdir="/wd", test=ITEM, case="canonical seed0", passed=False)
    assert not ledger.account([failed]).passed


# -- the schema's versions -------------------------------------------------------------------

def test_a_version_1_report_still_renders_and_a_newer_one_is_refused(tmp_path, capsys):
    old = tmp_path / "v1.json"
    old.write_text(json.dumps({"schema": "cudaopt-report/1", "passed": True, "results": []}))
    text = jsonreport.render_file(old)
    assert "schema 1: `passed` counts only the results listed" in text
    newer = tmp_path / "v3.json"
    newer.write_text(json.dumps({"schema": "cudaopt-report/3", "passed": True}))
    assert cli_main(["report", str(newer)]) == 2
    assert "schema 'cudaopt-report/3' is newer than this cudaopt reads" in capsys.readouterr().err


# -- end to end on the CPU example workdir ---------------------------------------------------

@pytest.fixture
def workdir(pytester, make_workdir, prebuilt_workdir):
    """The built cpu_scale workdir at pytester.path/wd, with its lock, judged on the CPU."""
    pytester.makeini(CPU_INI)
    path = make_workdir("cpu_scale", dest=pytester.path / "wd")
    shutil.copyfile(prebuilt_workdir("cpu_scale") / "cudaopt.lock", path / "cudaopt.lock")
    return path


def test_a_failed_rule_is_a_policy_record_and_fails_the_report(pytester, workdir, run_pytest):
    (workdir / "model.py").write_text((workdir / "model.py").read_text() + "# edited\n")
    result = run_pytest(pytester, "wd/model_new.py", "-m", "policy", "--cudaopt-report=r.json")
    assert result.ret == 1
    doc = read_report(pytester.path / "r.json")
    assert_not_passed(doc, "test_rule[PF003]: failed: wd/model.py:1: PF003: model.py changed")
    [policy] = [r for r in doc["results"] if r["kind"] == "policy"]
    assert policy["passed"] is False and policy["data"]["rules"]["PF003"] == "failed"
    assert policy["data"]["rules"]["EX001"] == "passed"
    assert policy["data"]["violations"][0].startswith("wd/model.py:1: PF003: model.py changed")
    statuses = {item["rule"]: item["status"] for item in doc["items"]}
    assert statuses["PF003"] == "failed" and list(statuses.values()).count("passed") == len(statuses) - 1
    result.stdout.fnmatch_lines(["cudaopt policy: 0 of 1 passed", "wd * of * passed  PF003 failed *FAIL",
                                 "cudaopt: NOT PASSED (* passed, 1 failed)"])


def test_a_run_stopped_at_its_first_failure_is_not_complete(pytester, workdir, run_pytest):
    (workdir / "model.py").write_text((workdir / "model.py").read_text() + "# edited\n")
    result = run_pytest(pytester, "wd/model_new.py", "-m", "policy", "-x", "--cudaopt-report=r.json")
    doc = read_report(pytester.path / "r.json")
    assert result.ret == 1 and (doc["complete"], doc["cause"]) == (False, "stopped")
    assert_not_passed(doc, "the session did not complete: stopped early", "not run: the session ended before it")


def test_policy_records_reach_the_report_through_pytest_xdist(pytester, workdir, run_pytest):
    (workdir / "model.py").write_text((workdir / "model.py").read_text() + "# edited\n")
    result = run_pytest(pytester, "-p", "xdist", "-n", "2", "wd/model_new.py", "-m", "policy",
                        "--cudaopt-report=r.json")
    assert result.ret == 1
    doc = read_report(pytester.path / "r.json")
    assert_not_passed(doc, "test_rule[PF003]: failed")
    assert doc["counts"]["failed"] == 1 and doc["counts"]["passed"] == len(doc["items"]) - 1 > 20


@NO_GPU
def test_skipped_gpu_items_never_read_as_a_pass(pytester, workdir, run_pytest):
    pytester.makeini("[pytest]\n")  # the workdir's device is cuda: its items skip here
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--cudaopt-report=r.json")
    assert result.ret == 0  # pytest's own status counts a skip as a success; the report does not
    doc = read_report(pytester.path / "r.json")
    assert_not_passed(doc, "4 items, skipped: no CUDA device visible")
    assert doc["counts"] == {"skipped": 4} and doc["complete"] is True
    result.stdout.fnmatch_lines(["cudaopt: NOT PASSED (4 skipped)"])


def test_an_unwritable_report_path_is_one_error_at_the_start_and_the_verdicts_still_run(pytester, workdir, run_pytest):
    result = run_pytest(pytester, "wd/model_new.py", "-m", "policy", "--cudaopt-report=/proc/nonexistent/r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] > 20 and "failed" not in outcomes and "error" not in outcomes
    text = result.stdout.str()
    assert text.count("cudaopt: ERROR: --cudaopt-report: /proc/nonexistent/r.json cannot be written") == 1
    assert text.index("cudaopt: ERROR") < text.index("collected")  # before any item ran
    result.stdout.fnmatch_lines(["cudaopt: ERROR: no JSON report: --cudaopt-report=/proc/nonexistent/r.json: *"])
    assert "Traceback" not in text


@pytest.mark.parametrize("target", ["j.xml", "wd/model.py", "wd"])
def test_a_report_path_on_another_file_is_refused_before_anything_runs(pytester, workdir, run_pytest, target):
    before = (workdir / "model.py").read_text()
    result = run_pytest(pytester, "wd/model_new.py", "-m", "policy", f"--cudaopt-report={target}", "--junitxml=j.xml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    why = {"j.xml": "is also the file of --junitxml", "wd/model.py": "exists and is not a cudaopt JSON report",
           "wd": "is a folder"}[target]
    result.stderr.fnmatch_lines([f"*cudaopt: --cudaopt-report={target}: * {why}*"])
    assert (workdir / "model.py").read_text() == before and not (pytester.path / "j.xml").exists()


def test_ex001_on_an_extension_that_does_not_import_fails_in_one_line_with_the_build_log(pytester, workdir,
                                                                                         run_pytest):
    [so] = (workdir / "build" / "cudaopt").glob("*/cuda_extension.so")
    so.write_bytes(b"not a shared object")
    result = run_pytest(pytester, "wd/model_new.py", "-m", "policy", "-k", "extension_functions")
    result.assert_outcomes(failed=1)
    [failure] = [line for line in result.outlines if line.startswith("EX001 not checked: ")]
    assert "was built but does not import" in failure and f"the build log: {so.parent / 'build.log'}" in failure
    section = result.stdout.str().split("= FAILURES =")[1].split("= cudaopt summary =")[0]
    assert len([line for line in section.splitlines() if line.strip("=_ ")]) == 2  # the item's name, the line
    assert "Traceback" not in result.stdout.str()


# -- exit codes that match what is printed ---------------------------------------------------

def test_the_classic_commands_never_exit_0_for_a_failure_or_nothing_run():
    nothing = classic.verification_lines({})
    assert nothing == ["[FAIL] verify failed: no correctness case ran (see pytest's output above)"]
    assert classic.exit_status(0, nothing) == 5
    failed = classic.verification_lines({"results": [{"kind": "correctness", "data": {"passed": False}}]})
    assert classic.exit_status(0, failed) == 1
    assert classic.exit_status(0, classic.profiling_lines({})) == 5
    assert classic.exit_status(0, ["Torch Baseline: 1.00us, Torch Compile: 1.00us, CUDA Extension: n/a"]) == 1
    assert classic.exit_status(0, ["Torch Baseline: 3.00us, Torch Compile: 2.00us, CUDA Extension: 1.00us"]) == 0
    assert classic.exit_status(2, ["[PASS] verify success"]) == 2


@NO_GPU
def test_verify_and_utils_verification_exit_5_when_no_item_ran(make_workdir, tmp_path):
    workdir = make_workdir("cpu_scale", dest=tmp_path / "wd")  # device cuda: its items skip here
    shutil.copytree(TEMPLATES / "utils", workdir / "utils", dirs_exist_ok=True)
    env = subprocess_env()
    done = run_python(["-m", "pytest_cudaopt.cli", "verify", str(workdir)], env=env, timeout=600)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "cudaopt: no correctness item ran: 4 skipped (no CUDA device visible" in done.stderr
    done = run_python(["-m", "utils.verification"], cwd=workdir, env=env, timeout=600)
    assert done.returncode == 5 and done.stdout.rstrip().endswith(
        "[FAIL] verify failed: no correctness case ran (see pytest's output above)"), done.stdout
    done = run_python(["-m", "utils.profiling", "--single-run", "cuda"], cwd=workdir, env=env, timeout=600)
    assert done.returncode == 2 and "unknown contender cuda" in done.stderr


def test_usage_errors_of_the_gate_exit_2(workdir, tmp_path):
    env = subprocess_env()
    gate = [sys.executable, "-m", "pytest_cudaopt.cli", "gate", str(workdir), "--out", str(tmp_path / "out")]
    done = subprocess.run([*gate, "--bogus"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "unrecognized arguments: --bogus (arguments for pytest go after `--`)" in done.stderr
    done = subprocess.run([*gate, "--", "--cudaopt-atol=abc"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pytest refused its arguments" in done.stdout


def test_ctrl_c_during_an_import_waits_for_the_import_and_exits_2(pytester, run_pytest):
    # The module interrupts itself halfway through its own import, as Ctrl-C during collection
    # does while pytest imports Hypothesis or torch: the interrupt waits for the import.
    pytester.makepyfile(halfway=textwrap.dedent("""
        import os, signal, time
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        DONE = True
    """))
    pytester.makeconftest("""
        import sys
        import time

        def pytest_collection_finish(session):
            import halfway  # noqa: F401
            time.sleep(2)  # collection goes on: the interrupt lands here

        def pytest_unconfigure(config):
            module = sys.modules.get("halfway")
            with open("halfway.txt", "w") as f:
                f.write("whole" if getattr(module, "DONE", False) else "half-made or missing")
    """)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = run_pytest(pytester, "--cudaopt-device=cpu", "--cudaopt-report=r.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert (pytester.path / "halfway.txt").read_text() == "whole"
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    doc = read_report(pytester.path / "r.json")
    assert (doc["complete"], doc["cause"], doc["reason"]) == (False, "interrupted", "interrupted by SIGINT (Ctrl-C)")
    assert_not_passed(doc, "the session did not complete: interrupted by SIGINT (Ctrl-C)")


def test_the_gate_never_passes_against_a_report_that_does_not(tmp_path):
    from pytest_cudaopt.commands import gate as ci_gate

    path = tmp_path / "report.json"
    assert ci_gate.report_disagrees(path) == [f"the JSON report is missing or unreadable: {path}: no such file"]
    path.write_text(json.dumps({"schema": "cudaopt-report/2", "passed": False,
                                "not_passed": ["wd/model_new.py::TestPolicy::test_extension_functions: skipped: "
                                               "EX001 needs the built extension"]}))
    assert ci_gate.report_disagrees(path) == ["the JSON report says not passed: wd/model_new.py::TestPolicy::"
                                              "test_extension_functions: skipped: EX001 needs the built extension"]
    path.write_text(json.dumps({"schema": "cudaopt-report/2", "passed": True, "not_passed": []}))
    assert ci_gate.report_disagrees(path) == []
