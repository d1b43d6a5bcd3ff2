"""Hangs and crashes in a judged workdir (pytest_cudaopt/run/watchdog.py, sentinel.py): a hang in ModelNew (its worker) or in the reference (the judging process) fails its item with the case, and the run still ends with its JUnit file, JSON report and summary, whoever has to end it."""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import CHEAT_VARIANTS as VARIANTS, CPU_INI as INI, junit_cases, run_pytest, subprocess_env

from pytest_cudaopt.launch import plugin_args


# Three kinds of hang (see pytest_cudaopt/run/watchdog.py): Python code the watchdog's signal
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


def _run_hang_through_pipes(pytester, cheat, kind: str, ini: str = "", where: str = "model.py",
                            timeout: float = TIMEOUT) -> Ended:
    _hanging(cheat(), kind, where)
    pytester.makeini(INI + ini)
    return _run_through_pipes(pytester, "wd/model_new.py", "-m", "correctness or policy",
                              f"--cudaopt-timeout={timeout:g}", "--cudaopt-report=r.json", "--junitxml=j.xml")


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
    assert result.stdout.str().count("replacing crashed worker") == 1   # not sent again to its replacement
    assert "writing the reports after the timeout failed" not in result.stderr.str()
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["passed"] is False  # no worker result reached the controller: the item counts
    [failed] = [item for item in report["items"] if item["status"] != "passed"]
    assert failed["test"] == hung.replace("[[]", "[") and failed["reason"].startswith("TIMEOUT: "), failed
    assert failed["status"] == "failed"


@pytest.mark.parametrize("kind", ["holds_the_gil", "segfaults"])
def test_a_gil_holding_hang_or_a_crash_in_model_new_fails_one_case_and_the_run_goes_on(pytester, cheat, kind):
    # A crash ends its case at once: its limit is not what is tested, and the worker's start inside the first case
    # took longer than 6 s on a loaded 2-core CI machine.
    result = _run_hang_through_pipes(pytester, cheat, kind, where="model_new.py",
                                     timeout=TIMEOUT if kind == "holds_the_gil" else 60)
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
    # thread's frames during an import can crash CPython 3.11 (seen with a 1 s timeout, and once with 6 s
    # on a loaded CI host, where the item's worker took that long to start).
    # CPython 3.11's dump also crashed once while the main thread left a frame (selectors' close, waiting on the
    # worker): the sentinel then says CRASH. That crash is the interpreter's, so such a run is tried once more.
    pytester.makeini(INI + "faulthandler_timeout = 10\n")
    for _ in range(2):
        result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--cudaopt-timeout=15", timeout=120)
        if not (sys.version_info < (3, 12) and "CRASH: the pytest process ended" in result.stderr.str()):
            break
    result.stderr.fnmatch_lines(["*Timeout (0:00:10)!*"])  # pytest's dump, then ours fails the item
    result.stdout.fnmatch_lines(["*TIMEOUT: *test_canonical[[]seed0] ran longer than cudaopt_timeout=15s*"])


def test_the_watchdog_never_interrupts_a_debugger(tmp_path):
    script = tmp_path / "debugged.py"
    script.write_text(textwrap.dedent("""
        import bdb, sys, time
        from pytest_cudaopt.run import watchdog

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
        from pytest_cudaopt.run import watchdog

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


FILLS = {   # ModelNew.forward writing 256 MiB (the one folder it may write, or its output), then waiting
    "file": "with open(os.path.join(tempfile.gettempdir(), 'fill'), 'wb') as f:\n"
            "            for _ in range(32):\n"
            "                f.write(os.urandom(1 << 23))",
    "print": "for _ in range(32):\n"
             "            print('x' * (1 << 23), flush=True)",
}


@pytest.mark.parametrize("how", sorted(FILLS))
def test_a_worker_that_fills_its_scratch_folder_is_killed_and_fails_its_test(pytester, cheat, how):
    """A disk filled by one candidate would fail its neighbours' builds and reports: the judging process weighs the
    worker's scratch folder (its log in it) and kills it past cudaopt_scratch_limit, a failure of the candidate's."""
    workdir = cheat()
    source = (VARIANTS / "hangs.py").read_text().replace("import time", "import os\nimport tempfile\nimport time")
    (workdir / "model_new.py").write_text(source.replace("time.sleep(3600)", FILLS[how] + "\n        time.sleep(60)"))
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--cudaopt-timeout=40",
                        "--cudaopt-scratch-limit=0.1", "--cudaopt-report=r.json", "-x", timeout=120)
    result.stdout.fnmatch_lines(["*test_canonical[[]seed0]*the candidate's worker process was killed (it wrote 0.* GiB "
                                 "in * files to its scratch folder (temporary files and printed output), past "
                                 "cudaopt_scratch_limit=0.1 GiB or 100000 files) while*"])
    [item] = [i for i in json.loads((pytester.path / "r.json").read_text())["items"] if "seed0" in i["test"]]
    assert item["status"] == "failed" and item["blame"] == "candidate", item


def test_a_scratch_folder_weighs_its_blocks_not_its_sizes_and_the_walk_ends_past_the_most_entries(tmp_path):
    from pytest_cudaopt.run.scratch import weigh

    with open(tmp_path / "sparse", "wb") as f:   # 1 GiB long, nothing written: no disk taken
        f.truncate(1 << 30)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(os.urandom(1 << 20))
    for i in range(20):
        (tmp_path / f"e{i}").touch()
    size, entries = weigh(tmp_path, 1000)
    assert (1 << 20) <= size < (1 << 20) + (1 << 18) and entries == 23, (size, entries)
    assert weigh(tmp_path, 5)[1] == 6   # a folder of millions of files is not walked to its end
