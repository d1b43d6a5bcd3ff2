"""`pytest -m correctness` end to end on CPU workdirs: an honest workdir passes, every planted cheat fails naming its cause."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from support import junit_cases, PREBUILT_ROOT, run_pytest, run_python, subprocess_env, WORKDIRS

from pytest_cudaopt.launch import plugin_args

VARIANTS = WORKDIRS / "cheat_kernels" / "variants"
INI = "[pytest]\ncudaopt_device = cpu\n"
CANONICAL = ("test_canonical[seed0]", "test_canonical[seed1]", "test_canonical[seed2]")
DRAWN = "test_drawn_shapes"
# Workdirs judged together in one pytest session (one start-up for all; several workdirs in
# one process must not clash): "honest" is cheat_kernels' own model_new.py, the others are
# that workdir with model_new.py replaced by variants/<name>.py.
SHARED = ("honest", "canonical_only", "rejects_odd_sizes", "caches_output", "mutates_input",
          "returns_input", "returns_view", "python_matmul", "python_softmax", "python_method",
          "cpp_aten", "unwritten", "flaky", "flaky_declared", "bf16", "wrong_state", "import_error")


def copy_cheat(prebuilt_workdir, dest: Path, variant: str = "honest") -> Path:
    """A copy of the built cheat_kernels workdir at `dest`, with model_new.py replaced by
    variants/<variant>.py (the extension stays built: the copy builds in about a second)."""
    src = prebuilt_workdir("cheat_kernels")
    with FileLock(str(PREBUILT_ROOT / "cheat_kernels.lock")):
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    if variant != "honest":
        shutil.copyfile(VARIANTS / f"{variant}.py", dest / "model_new.py")
    return dest


@dataclass
class Verdicts:
    """The outcome of one pytest session over the SHARED workdirs."""

    output: str
    cases: dict[tuple[str, str], tuple[str, str]]  # (workdir, test name) -> (outcome, text)
    report: dict

    def outcome(self, workdir: str, test: str) -> str:
        return self.cases[(workdir, test)][0]

    def text(self, workdir: str, test: str) -> str:
        return self.cases[(workdir, test)][1]

    def result(self, workdir: str, case_prefix: str) -> dict:
        """The JSON report's data of a workdir's result whose case starts with `case_prefix`."""
        for rec in self.report["results"]:
            data = rec["data"]
            if Path(data["workdir"]).name == workdir and data["case"].startswith(case_prefix):
                return data
        raise KeyError(f"no result {case_prefix!r} for {workdir} in the report")


@pytest.fixture(scope="module")
def verdicts(prebuilt_workdir, tmp_path_factory) -> Verdicts:
    root = tmp_path_factory.mktemp("verdicts")
    for name in SHARED:
        copy_cheat(prebuilt_workdir, root / name, name)
    (root / "pytest.ini").write_text(INI)
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-m", "correctness",
           f"--junitxml={root / 'junit.xml'}", f"--cudaopt-report={root / 'report.json'}",
           *[f"{name}/model_new.py" for name in SHARED]]
    done = run_python(cmd[1:], cwd=root, timeout=900)
    output = done.stdout + done.stderr
    assert (root / "junit.xml").is_file(), output
    return Verdicts(output, junit_cases(root / "junit.xml"), json.loads((root / "report.json").read_text()))


# -- the honest workdir and the candidates that are right ---------------------------------------

def test_it_passes_an_honest_workdir_on_every_seed_and_drawn_shape(verdicts):
    for test in (*CANONICAL, DRAWN):
        assert verdicts.outcome("honest", test) == "passed", verdicts.text("honest", test)
    drawn = verdicts.result("honest", "drawn shapes")
    assert drawn["passed"] and drawn["cases"] >= 20  # the ci profile's count
    assert drawn["precision"]["tier"] == "fp32"
    canonical = verdicts.result("honest", "canonical seed0")
    assert canonical["inputs"] == "x: float32[16, 64]" and canonical["max_abs"] == 0.0


def test_the_three_canonical_seeds_give_three_different_secret_inputs(verdicts):
    seeds = {verdicts.result("honest", f"canonical seed{i}")["seed"] for i in range(3)}
    assert len(seeds) == 3


def test_it_passes_a_reduced_precision_candidate_and_reports_it_as_half_like(verdicts):
    for test in (*CANONICAL, DRAWN):
        assert verdicts.outcome("bf16", test) == "passed", verdicts.text("bf16", test)
    data = verdicts.result("bf16", "canonical seed0")
    assert data["precision"]["tier"] == "half-like"
    assert 1e-3 < data["precision"]["candidate_error"] < 4e-3
    assert data["precision"]["reference_error"] < 1e-6
    assert any("bf16" in line and "half-like" in line and "pass" in line for line in verdicts.output.splitlines())


def test_it_accepts_last_bit_differences_from_a_workdir_that_declares_them(verdicts):
    for test in (*CANONICAL, DRAWN):
        assert verdicts.outcome("flaky_declared", test) == "passed", verdicts.text("flaky_declared", test)


def test_the_summary_prints_one_correctness_table_for_every_workdir(verdicts):
    # Every item that ran has a row (import_error's items never ran): 16 workdirs x 4 items.
    # Passed: honest, bf16, flaky_declared (4 each), canonical_only and rejects_odd_sizes (3 each).
    assert "cudaopt summary" in verdicts.output
    assert "cudaopt correctness: 18 of 64 passed" in verdicts.output
    rows = [line for line in verdicts.output.splitlines() if line.startswith(("honest ", "bf16 "))]
    assert len(rows) == 8, verdicts.output
    assert len(verdicts.report["results"]) == 64


# -- cheats --------------------------------------------------------------------------------------

def test_it_fails_a_candidate_that_is_correct_only_at_the_canonical_shape(verdicts):
    for test in CANONICAL:
        assert verdicts.outcome("canonical_only", test) == "passed"
    assert verdicts.outcome("canonical_only", DRAWN) == "failed"
    text = verdicts.text("canonical_only", DRAWN)
    assert "ModelNew's output differs from Model's" in text
    assert "NaN where the reference has a value" in text        # the unwritten tail
    assert "case: drawn shape batch_size=" in text and "inputs x: float32[" in text
    assert "replay: pytest " in text and "--cudaopt-seed=" in text and "--cudaopt-case=batch_size=" in text


def test_it_fails_a_candidate_that_raises_on_a_valid_drawn_shape_with_its_line(verdicts):
    assert verdicts.outcome("rejects_odd_sizes", "test_canonical[seed0]") == "passed"
    text = verdicts.text("rejects_odd_sizes", DRAWN)
    assert verdicts.outcome("rejects_odd_sizes", DRAWN) == "failed"
    assert "ModelNew.forward raised" in text
    assert "model_new.py:17 in forward" in text and "ValueError: features must be a multiple of 4" in text


def test_it_fails_a_candidate_that_caches_its_output(verdicts):
    for test in (*CANONICAL, DRAWN):
        assert verdicts.outcome("caches_output", test) == "failed"
    text = verdicts.text("caches_output", "test_canonical[seed0]")
    assert "returned the same tensor object returned by an earlier call" in text and "cached" in text


def test_it_fails_a_candidate_that_mutates_an_input(verdicts):
    text = verdicts.text("mutates_input", "test_canonical[seed0]")
    assert verdicts.outcome("mutates_input", "test_canonical[seed0]") == "failed"
    assert "ModelNew.forward wrote into input 0 (x) float32[16, 64]" in text
    assert "1024 of 1024 elements changed" in text


def test_it_fails_a_candidate_that_returns_its_input(verdicts):
    text = verdicts.text("returns_input", "test_canonical[seed0]")
    assert verdicts.outcome("returns_input", "test_canonical[seed0]") == "failed"
    assert "output float32[16, 64] on cpu is input 0 (x)" in text


def test_it_fails_a_candidate_that_returns_a_view_of_its_input(verdicts):
    text = verdicts.text("returns_view", "test_canonical[seed0]")
    assert verdicts.outcome("returns_view", "test_canonical[seed0]") == "failed"
    assert "shares storage with (a view of) input 0 (x)" in text


@pytest.mark.parametrize("variant, expected", [
    ("python_matmul", ["model_new.py:16: aten::mm from torch.matmul", "aten::diag_embed from torch.diag"]),
    ("python_softmax", ["model_new.py:17: aten::_softmax from Tensor.softmax via torch/nn/functional.py",
                        "model_new.py:18: aten::mul.Tensor from a Python operator"]),
    ("python_method", ["model_new.py:16: aten::mul.Tensor from Tensor.mul",
                       "model_new.py:16: aten::add.Tensor from Tensor.add"]),
])
def test_it_fails_a_candidate_that_computes_with_torch_in_python_naming_op_and_line(verdicts, variant, expected):
    text = verdicts.text(variant, "test_canonical[seed0]")
    assert verdicts.outcome(variant, "test_canonical[seed0]") == "failed"
    assert "operator(s) outside the allow-list" in text
    for line in expected:
        assert line in text


def test_it_fails_a_candidate_whose_cpp_binding_calls_aten_ops(verdicts):
    text = verdicts.text("cpp_aten", "test_canonical[seed0]")
    assert verdicts.outcome("cpp_aten", "test_canonical[seed0]") == "failed"
    assert "model_new.py:16: aten::mul.Tensor sent from C++ inside cuda_extension.scale_aten" in text
    assert "aten::add.Tensor sent from C++ inside cuda_extension.scale_aten" in text


def test_it_fails_a_candidate_that_leaves_part_of_the_output_unwritten(verdicts):
    text = verdicts.text("unwritten", "test_canonical[seed0]")
    assert verdicts.outcome("unwritten", "test_canonical[seed0]") == "failed"
    assert "1 of 1024 elements" in text and "actual nan" in text and "[15, 63]" in text
    assert "output elements the candidate never wrote" in text


def test_it_fails_a_candidate_that_gives_different_results_on_two_runs(verdicts):
    text = verdicts.text("flaky", "test_canonical[seed0]")
    assert verdicts.outcome("flaky", "test_canonical[seed0]") == "failed"
    assert "two runs of ModelNew on the same inputs differ in 1 of 1024 elements" in text
    assert "CUDAOPT_NONDETERMINISTIC = True" in text
    assert verdicts.result("flaky", "canonical seed0")["check"] == "nondeterministic"


# -- workdirs that do not load ---------------------------------------------------------------------

def test_a_state_dict_mismatch_names_the_missing_and_unexpected_keys(verdicts):
    text = verdicts.text("wrong_state", "test_canonical[seed0]")
    assert verdicts.outcome("wrong_state", "test_canonical[seed0]") == "failed"
    assert "ModelNew's state_dict keys differ from Model's (model.py)" in text
    assert "missing (in Model, not in ModelNew): bias, weight" in text
    assert "unexpected (in ModelNew, not in Model): scale, shift" in text


def test_an_import_error_names_the_file_and_the_line(verdicts):
    outcome, text = verdicts.cases[("import_error", "test_canonical[seed0]")]
    assert outcome == "error"  # the workdir fixture fails: no test of it can run
    assert "import_error/model_new.py failed" in text
    assert "model_new.py:7 in <module>: from helpers_that_do_not_exist import fused_scale" in text
    assert "ModuleNotFoundError: No module named 'helpers_that_do_not_exist'" in text
    assert "Traceback" not in text


# -- sessions of their own -----------------------------------------------------------------------

@pytest.fixture
def cheat(pytester, prebuilt_workdir):
    """`cheat(variant)`: pytester.path/wd, the built cheat workdir with that model_new.py."""

    def make(variant: str = "honest") -> Path:
        pytester.makeini(INI)
        return copy_cheat(prebuilt_workdir, pytester.path / "wd", variant)

    return make


def test_a_cuda_fault_fails_its_test_and_the_later_ones_report_it_instead_of_cascading(pytester, cheat):
    cheat("fault")
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness")
    result.assert_outcomes(failed=1, errors=3)
    result.stdout.fnmatch_lines([
        "*CUDA fault on case canonical inputs of get_inputs(), seed *",
        "*CUDA error: an illegal memory access was encountered*",
        "*compute-sanitizer pytest 'wd/model_new.py::TestCorrectness::test_canonical[[]seed0]' --cudaopt-seed=*",
    ])
    result.stdout.fnmatch_lines([
        "*not run: an earlier CUDA fault in wd/model_new.py::TestCorrectness::test_canonical[[]seed0] *",
    ])
    result.stdout.fnmatch_lines(["*cudaopt summary*", "*FAIL (CUDA fault)*"])


# Three kinds of hang (see pytest_cudaopt/watchdog.py): Python code the watchdog's signal
# interrupts; a C call that released the GIL and never returns (a CUDA kernel that never ends;
# here a second lock of a pthread mutex, which no signal interrupts); a C call that holds the
# GIL (ctypes.PyDLL does not release it).
HANGS = {
    "sleeps": "time.sleep(3600)",
    "python_loop": "while True:\n            pass",
    "blocked_in_c": ("mutex = ctypes.create_string_buffer(64)\n"
                     "        libc = ctypes.CDLL(None)\n"
                     "        libc.pthread_mutex_lock(mutex)\n"
                     "        libc.pthread_mutex_lock(mutex)"),
    "holds_the_gil": "ctypes.PyDLL(None).sleep(3600)",
    "segfaults": "ctypes.string_at(0)",
}


TIMEOUT = 6
# The watchdog's waits after the timeout in this suite's pytest children (tests/conftest.py).
AFTER = int(float(os.environ["CUDAOPT_WATCHDOG_GRACE_S"]) + float(os.environ["CUDAOPT_WATCHDOG_BACKSTOP_S"]))


def _hanging(workdir: Path, kind: str, where: str = "model_new.py") -> None:
    """Plant the hang in ModelNew.forward (it runs in the workdir's worker) or, with `where` =
    model.py, in Model.forward (the reference, in the judging process itself)."""
    if where == "model_new.py":
        source = (VARIANTS / "hangs.py").read_text().replace("import time", "import ctypes\nimport time")
        (workdir / "model_new.py").write_text(source.replace("time.sleep(3600)", HANGS[kind]))
        return
    source = (workdir / "model.py").read_text()
    body = "return x * self.weight + self.bias"
    assert body in source
    (workdir / "model.py").write_text("import ctypes\nimport time\n" + source.replace(body, f"{HANGS[kind]}\n        {body}"))


def _run_hang(pytester, cheat, kind: str, where: str = "model_new.py"):
    _hanging(cheat(), kind, where)
    # The timeout leaves room for the item's own start (torch._dynamo's import on a busy machine).
    return run_pytest(pytester, "wd/model_new.py", "-m", "correctness or policy", f"--cudaopt-timeout={TIMEOUT}",
                      "--cudaopt-report=r.json", "--junitxml=j.xml", "-rA", timeout=120)


# A hang in ModelNew is a hang of its worker: however it hangs (even blocked in C), the judging
# process fails the item and goes on. In the reference a hang blocked in C is the judging
# process's own, and the watchdog ends the run.
@pytest.mark.parametrize("kind, where", [("sleeps", "model_new.py"), ("python_loop", "model_new.py"),
                                         ("blocked_in_c", "model_new.py"), ("blocked_in_c", "model.py")])
def test_a_hang_fails_its_test_with_the_case_and_the_run_still_reports(pytester, cheat, kind, where):
    result = _run_hang(pytester, cheat, kind, where)
    assert result.ret == 1
    hung = "wd/model_new.py::TestCorrectness::test_canonical[[]seed0]"
    result.stdout.fnmatch_lines([
        f"*TIMEOUT: {hung} ran longer than cudaopt_timeout={TIMEOUT}s on case canonical inputs of get_inputs(), seed *",
    ])
    result.stdout.fnmatch_lines(["*cudaopt summary*", "*FAIL (timeout)*"])
    assert "During handling" not in result.stdout.str()
    cases = junit_cases(pytester.path / "j.xml")
    assert cases[("wd", "test_canonical[seed0]")][0] == "failed"
    assert "on case canonical inputs of get_inputs()" in cases[("wd", "test_canonical[seed0]")][1]
    for later in ("test_canonical[seed1]", "test_canonical[seed2]", "test_drawn_shapes"):
        outcome, text = cases[("wd", later)]
        assert outcome in ("error", "skipped") and "not run" in text and "test_canonical[seed0]" in text, later
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["passed"] is False
    [row] = [r["data"] for r in report["results"] if r["data"].get("check") == "timeout"]
    assert row["case"].startswith("canonical inputs of get_inputs()")
    policy = [outcome for (_, name), (outcome, text) in cases.items() if name.startswith("test_rule[")]
    assert policy
    if where == "model_new.py":
        result.stdout.fnmatch_lines(["where it was:", "  model_new.py:* in forward: * (in the worker)"])
    if where == "model.py":  # the watchdog ended the run: the policy items are reported as not run
        result.stderr.fnmatch_lines([f"*did not stop within {os.environ['CUDAOPT_WATCHDOG_GRACE_S']}s of being interrupted*"])
        assert set(policy) == {"skipped"}
        assert (report["complete"], report["cause"]) == (False, "timeout")
        assert {i["status"] for i in report["items"] if i["kind"] == "policy"} == {"not run"}
    else:  # the process went on: the policy items ran
        assert "passed" in policy
        assert report["complete"] is True


@dataclass
class Ended:
    ret: int
    stdout: pytest.LineMatcher
    stderr: pytest.LineMatcher


def _run_through_pipes(pytester, *args: str) -> Ended:
    """pytest in pytester.path with its output read through pipes until every writer closed
    them, as a CI log reads it: what the sentinel writes after pytest died is included."""
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", *args]
    done = subprocess.run(cmd, cwd=pytester.path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    return Ended(done.returncode, pytest.LineMatcher(done.stdout.splitlines()),
                 pytest.LineMatcher(done.stderr.splitlines()))


def _run_hang_through_pipes(pytester, cheat, kind: str, ini: str = "", where: str = "model.py") -> Ended:
    _hanging(cheat(), kind, where)
    pytester.makeini(INI + ini)
    return _run_through_pipes(pytester, "wd/model_new.py", "-m", "correctness or policy",
                              f"--cudaopt-timeout={TIMEOUT}", "--cudaopt-report=r.json", "--junitxml=j.xml")


def _assert_the_sentinel_wrote_what_remains(pytester, result, failure: str) -> None:
    """The JUnit file and the stderr summary written by sentinel.py after pytest died in the
    first canonical item; the JSON report is the one written before that item."""
    hung = "wd/model_new.py::TestCorrectness::test_canonical[seed0]"
    result.stderr.fnmatch_lines([
        "cudaopt: the pytest process ended before its session finished; what remains, from the sentinel:",
        f"  FAILED {hung.replace('[', '[[]')}: {failure}*",
        "cudaopt: 1 failed, * skipped (* of the skipped not run)",
        f"cudaopt: JUnit file written to {pytester.path / 'j.xml'} by the sentinel",
    ])
    cases = junit_cases(pytester.path / "j.xml")
    outcome, text = cases[("wd", "test_canonical[seed0]")]
    assert outcome == "failed" and text.startswith(failure), text
    later = {name: outcome for (_, name), (outcome, _) in cases.items() if name != "test_canonical[seed0]"}
    assert "test_drawn_shapes" in later and any(name.startswith("test_rule[") for name in later)
    assert set(later.values()) == {"skipped"}
    assert all(f"not run: the pytest process ended while {hung} ran" in text
               for (_, name), (_, text) in cases.items() if name in later)
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["complete"] is False and not report["passed"]
    assert report["running"] == hung


def test_a_hang_that_holds_the_gil_ends_with_a_junit_file_and_the_report_written_before_the_item(pytester, cheat):
    result = _run_hang_through_pipes(pytester, cheat, "holds_the_gil")
    assert result.ret != 0
    result.stderr.fnmatch_lines([f"*Timeout (0:00:{TIMEOUT + AFTER:02d})!*", "*model.py*line * in forward*"])
    _assert_the_sentinel_wrote_what_remains(pytester, result, f"TIMEOUT: ran longer than cudaopt_timeout={TIMEOUT}s "
                                            f"and was still running {AFTER - 1} s later: a C/C++ loop that holds the GIL")


def test_a_crash_ends_with_a_junit_file_and_a_summary(pytester, cheat):
    result = _run_hang_through_pipes(pytester, cheat, "segfaults")
    assert result.ret not in (0, 1)  # killed by SIGSEGV (faulthandler's dump, then the signal)
    result.stderr.fnmatch_lines(["Fatal Python error: Segmentation fault"])
    _assert_the_sentinel_wrote_what_remains(pytester, result, "CRASH: the pytest process ended while this test ran")


def test_a_hang_that_holds_the_gil_ends_even_when_pytests_faulthandler_owns_the_timer(pytester, cheat):
    # pytest's faulthandler_timeout only dumps; it never ends the process
    result = _run_hang_through_pipes(pytester, cheat, "holds_the_gil", "faulthandler_timeout = 60\n")
    assert result.ret not in (0, 1)
    result.stderr.fnmatch_lines(["cudaopt: ending pytest (pid *) with SIGABRT: nothing else ends it",
                                 "Fatal Python error: Aborted"])
    _assert_the_sentinel_wrote_what_remains(pytester, result, "TIMEOUT: ran longer than")


def test_a_hang_in_a_pytest_xdist_worker_fails_the_item_and_the_report(pytester, cheat):
    _hanging(cheat(), "blocked_in_c", "model.py")
    result = run_pytest(pytester, "-p", "xdist", "-n", "2", "wd/model_new.py", "-m", "correctness",
                        "-k", "canonical and seed0", f"--cudaopt-timeout={TIMEOUT}", "--cudaopt-report=r.json",
                        timeout=120)
    assert result.ret == 1
    hung = "wd/model_new.py::TestCorrectness::test_canonical[[]seed0]"
    # The worker reports the timeout with its case, then exits; the controller adds the crash.
    result.stdout.fnmatch_lines([f"TIMEOUT: {hung} ran longer than *", f"worker 'gw*' crashed while running '{hung}'"],
                                consecutive=False)
    assert "writing the reports after the timeout failed" not in result.stderr.str()
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["passed"] is False  # no worker result reached the controller: the item counts
    [failed] = [item for item in report["items"] if item["status"] != "passed"]
    assert failed["test"] == hung.replace("[[]", "[") and failed["reason"].startswith("TIMEOUT: "), failed
    assert failed["status"] == "failed"


@pytest.mark.parametrize("kind", ["holds_the_gil", "segfaults"])
def test_a_gil_holding_hang_or_a_crash_in_model_new_fails_one_case_and_the_run_goes_on(pytester, cheat, kind):
    result = _run_hang_through_pipes(pytester, cheat, kind, where="model_new.py")
    assert result.ret == 1
    cases = junit_cases(pytester.path / "j.xml")
    outcome, text = cases[("wd", "test_canonical[seed0]")]
    assert outcome == "failed", text
    assert ("TIMEOUT:" in text) if kind == "holds_the_gil" else ("the candidate's worker process was killed by "
                                                                 "signal SIGSEGV" in text), text
    assert "from the sentinel" not in result.stderr.str()
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["complete"] is True and report["passed"] is False


def test_a_run_that_finishes_leaves_the_junit_file_to_pytest(pytester, cheat):
    cheat()
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--junitxml=j.xml")
    result.assert_outcomes(passed=4)
    assert "from the sentinel" not in result.stderr.str()
    assert 'testsuite name="pytest"' in (pytester.path / "j.xml").read_text()


def test_pytests_faulthandler_timeout_keeps_its_timer(pytester, cheat):
    _hanging(cheat(), "python_loop")
    # pytest's dump comes once the item is in its loop: a faulthandler dump that walks the main
    # thread's frames during an import can crash CPython 3.11 (seen with a 1 s timeout).
    pytester.makeini(INI + "faulthandler_timeout = 6\n")
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--cudaopt-timeout=10", timeout=120)
    result.stderr.fnmatch_lines(["*Timeout (0:00:06)!*"])  # pytest's dump, then ours fails the item
    result.stdout.fnmatch_lines(["*TIMEOUT: *test_canonical[[]seed0] ran longer than cudaopt_timeout=10s*"])


def test_the_watchdog_never_interrupts_a_debugger(tmp_path):
    script = tmp_path / "debugged.py"
    script.write_text(textwrap.dedent("""
        import bdb, sys, time
        from pytest_cudaopt import watchdog

        class Quiet(bdb.Bdb):
            def user_line(self, frame):
                pass

        dbg = Quiet()
        with watchdog.Watchdog(0.5, "t.py::test_x", backstop=True):
            dbg.set_trace()      # a debugger is attached: the timeout must not fire
            time.sleep(2.5)
            dbg.set_quit()
            sys.settrace(None)
        print("survived")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr
    assert "TIMEOUT" not in done.stderr


def test_the_watchdog_lets_an_import_finish_before_it_interrupts(tmp_path):
    # An exception raised inside an import leaves a half-made module behind (torch._inductor,
    # imported by the first torch.use_deterministic_algorithms, takes seconds on a busy machine).
    (tmp_path / "slow_module.py").write_text(
        "import time\nstart = time.monotonic()\nwhile time.monotonic() - start < 1.5:\n    pass\nDONE = True\n")
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent("""
        import sys
        from pytest_cudaopt import watchdog

        try:
            with watchdog.Watchdog(0.3, "t.py::test_x", backstop=False):
                import slow_module
                while True:
                    pass
        except watchdog.HangTimeout:  # (said here: the interrupt may land on any line after the import)
            print("imported", getattr(sys.modules.get("slow_module"), "DONE", False))
            print("interrupted after the import:", "slow_module" in sys.modules)
    """))
    env = {**subprocess_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{subprocess_env()['PYTHONPATH']}"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.splitlines() == ["imported True", "interrupted after the import: True"], \
        done.stdout + done.stderr


def test_a_drawn_failure_replays_from_the_printed_command(pytester, cheat):
    cheat("canonical_only")
    first = run_pytest(pytester, "wd/model_new.py::TestCorrectness::test_drawn_shapes")
    first.assert_outcomes(failed=1)
    replay = next(line for line in first.stdout.lines if line.startswith("replay: pytest "))
    again = run_pytest(pytester, *shlex.split(replay.removeprefix("replay: pytest ")))
    again.assert_outcomes(failed=1)
    case = next(line for line in first.stdout.lines if line.startswith("case: drawn shape"))
    assert case in again.stdout.lines  # same shape, same seed, same inputs
    assert "max abs err" in again.stdout.str()


@pytest.mark.parametrize("seed", [4, 5])  # seeds whose draws once met a shape judged already
def test_a_drawn_failure_is_reported_with_its_case_whichever_draws_repeat_a_shape(pytester, cheat, seed):
    # Hypothesis replays draws and maps several draws to one shape: a shape judged already must
    # keep its outcome (no "flaky" verdict, no Hypothesis error about inconsistent results).
    cheat("canonical_only")
    result = run_pytest(pytester, "wd/model_new.py::TestCorrectness::test_drawn_shapes", f"--cudaopt-seed={seed}")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "FlakyFailure" not in text and "did not happen again" not in text, text
    result.stdout.fnmatch_lines(["case: drawn shape batch_size=*,features=* (canonical: batch_size=16,features=64)*"])


@pytest.mark.parametrize("seed", [12, 13])  # seeds whose 25 draws never met an odd batch with > 64 features
def test_a_kernel_wrong_only_when_two_sizes_leave_its_tuning_together_fails(pytester, cheat, seed):
    cheat("odd_and_wide")
    result = run_pytest(pytester, "wd/model_new.py::TestCorrectness::test_drawn_shapes", f"--cudaopt-seed={seed}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["case: drawn shape batch_size=*,features=* (canonical: batch_size=16,features=64)*"])


def test_a_replayed_shape_that_passes_passes(pytester, cheat):
    cheat("canonical_only")
    result = run_pytest(pytester, "wd/model_new.py::TestCorrectness::test_drawn_shapes",
                        "--cudaopt-case=batch_size=3,features=8")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*drawn shapes (1 cases)*x: float32[[]3, 8]*pass*"])


def test_a_build_error_fails_every_item_with_the_compiler_report(pytester, cheat):
    workdir = cheat()
    broken = workdir / "kernels" / "broken.cpp"
    broken.write_text('#error "deliberately broken kernel"\n')
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness")
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines(["*kernels/broken.cpp:1*deliberately broken kernel*"])
    assert "Traceback" not in result.stdout.str()


def test_cudaopt_verify_prints_the_same_verdict_and_exits_non_zero_on_a_cheat(pytester, cheat):
    env = {**subprocess_env(), "CUDAOPT_DEVICE": "cpu"}
    command = [sys.executable, "-m", "pytest_cudaopt.cli", "verify", "wd"]
    cheat("unwritten")
    failing = run_python(command[1:], cwd=pytester.path, env=env, timeout=600)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "cudaopt correctness: 0 of 4 passed" in failing.stdout
    assert "FAIL (mismatch)" in failing.stdout and "output elements the candidate never wrote" in failing.stdout
    cheat("flaky_declared")
    passing = run_python(command[1:], cwd=pytester.path, env=env, timeout=600)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "cudaopt correctness: 4 of 4 passed" in passing.stdout


def test_a_load_error_is_reported_once_and_later_items_refer_to_it(pytester, cheat):
    cheat("import_error")
    pytester.makeini(INI + "cudaopt_compile_backend = eager\n")
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness or perf")
    result.assert_outcomes(errors=4, failed=1)
    # Up to pytest's short summary, which repeats each message's first line (in full where a
    # CI variable is set).
    text = result.stdout.str().split("short test summary info")[0].split("= cudaopt summary =")[0]
    assert text.count("ModuleNotFoundError: No module named 'helpers_that_do_not_exist'") == 1
    assert text.count("not run: loading the workdir failed; the report is under "
                      "wd/model_new.py::TestCorrectness::test_canonical[seed0]") == 4
    assert "During handling" not in text and "direct cause" not in text
    assert "PytestBenchmarkWarning" not in text


def test_a_build_error_is_reported_in_full_once_per_workdir(tmp_path):
    from pytest_cudaopt import build
    from pytest_cudaopt.session import CudaoptSession
    from pytest_cudaopt.settings import Settings

    session = CudaoptSession(Settings({}), rootpath=tmp_path)
    error = build.BuildError("cudaopt build: 1 error in kernels/x.cu", ["kernels/x.cu:3: error: nope"])
    first = session.failure_report(tmp_path / "wd", "wd/model_new.py::A::a", error)
    assert first == error.report() and "kernels/x.cu:3: error: nope" in first
    assert session.failure_report(tmp_path / "wd", "wd/model_new.py::A::a", error) == first  # a rerun
    assert session.failure_report(tmp_path / "wd", "wd/model_new.py::B::b", error) == (
        "not run: the build failed; the report is under wd/model_new.py::A::a")
    assert session.failure_report(tmp_path / "other", "other/model_new.py::A::a", error) == first


def test_the_build_shows_its_steps_and_a_lock_held_elsewhere_under_pytest(pytester, cheat):
    workdir = cheat()
    kernel = workdir / "kernels" / "cheats.cpp"
    kernel.write_text(kernel.read_text() + "\n// changed: this object recompiles\n")
    [build_dir] = (workdir / "build" / "cudaopt").iterdir()
    # Another process holds the build's lock from the start of the session for 6 s (collection takes
    # a snapshot of torch first).
    holder = (f"import time\nfrom filelock import FileLock\nwith FileLock({str(build_dir / 'lock')!r}):\n"
              "    print('held', flush=True)\n    time.sleep(6)\n")
    pytester.makeconftest(f"""
        import subprocess, sys

        def pytest_sessionstart(session):
            holder = subprocess.Popen([sys.executable, "-c", {holder!r}], stdout=subprocess.PIPE, text=True)
            assert holder.stdout.readline().strip() == "held"
    """)
    result = run_pytest(pytester, "wd/model_new.py::TestCorrectness::test_canonical[seed0]")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"cudaopt build: waiting for another build of {workdir} (lock {build_dir / 'lock'})",
        "cudaopt build: compiling 1 of 3 sources for cpu: kernels/cheats.cpp",
        "cudaopt build: [[]1/2[]] c++ kernels/cheats.cpp  (* s)",
        "cudaopt build: [[]2/2[]] link cuda_extension.so  (* s)",
        "cudaopt build: built cuda_extension in * s (1 of 3 objects compiled): *",
    ])
