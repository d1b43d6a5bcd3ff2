"""Isolation end to end on the CPU isolation workdir: a candidate that tries to make the reference compute its sigmoid (from model_new.py, from C++ through pybind11::exec, through the dispatcher, by a global flag, a hook, the caller's frames) changes only its own worker's torch; the reference, in the judging process, computes the real softmax, and the cheat fails as the wrong answer it is, in the correctness and the perf items alike."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from support import junit_cases, PREBUILT_ROOT, run_pytest, run_python, subprocess_env, WORKDIRS

VARIANTS = WORKDIRS / "cpu_isolation" / "variants"
CANONICAL = ("test_canonical[seed0]", "test_canonical[seed1]", "test_canonical[seed2]")
ITEMS = (*CANONICAL, "test_drawn_shapes")
INI = "[pytest]\ncudaopt_device = cpu\n"
WARNING = "candidate code changed what the reference and the baselines run"


def copy_variant(prebuilt_workdir, dest: Path, variant: str = "honest") -> Path:
    """The built isolation workdir at `dest` with model_new.py replaced by variants/<variant>.py."""
    src = prebuilt_workdir("cpu_isolation")
    with FileLock(str(PREBUILT_ROOT / "cpu_isolation.lock")):
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lock", "variants"))
    if variant != "honest":
        shutil.copyfile(VARIANTS / f"{variant}.py", dest / "model_new.py")
    return dest


@dataclass
class Session:
    output: str
    cases: dict[tuple[str, str], tuple[str, str]]
    report: dict

    def outcome(self, workdir: str, test: str) -> str:
        return self.cases[(workdir, test)][0]

    def text(self, workdir: str, test: str) -> str:
        return self.cases[(workdir, test)][1]


def judge(root: Path, names: list[str], *args: str, env: dict[str, str] | None = None) -> Session:

    from pytest_cudaopt.launch import plugin_args

    (root / "pytest.ini").write_text(INI)
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", *args,
           f"--junitxml={root / 'junit.xml'}", f"--cudaopt-report={root / 'report.json'}",
           *[f"{name}/model_new.py" for name in names]]
    done = run_python(cmd[1:], cwd=root, env={**subprocess_env(), **(env or {})}, timeout=900)
    output = done.stdout + done.stderr
    assert (root / "junit.xml").is_file(), output
    return Session(output, junit_cases(root / "junit.xml"), json.loads((root / "report.json").read_text()))


# The cheats of one session, the honest workdir before and after them. The wrong ones compute a
# sigmoid and count on the reference computing it too; flag_in_forward computes the softmax and
# lowers the matmul precision for whoever runs after it (in-process: the reference).
CHEATS = ["python_patch", "exec_patch", "reference_patch", "reference_code", "global_hook"]
RESTORABLE = ["honest", *CHEATS, "flag_in_forward", "honest_after"]
MISMATCH = "ModelNew's output differs from Model's"


@pytest.fixture(scope="module")
def restorable(prebuilt_workdir, tmp_path_factory) -> Session:
    root = tmp_path_factory.mktemp("isolation")
    for name in RESTORABLE:
        copy_variant(prebuilt_workdir, root / name, "honest" if name.startswith("honest") else name)
    return judge(root, RESTORABLE, "-m", "correctness")


def test_the_honest_workdir_passes_before_and_after_the_cheats(restorable):
    for name in ("honest", "honest_after", "flag_in_forward"):
        for test in ITEMS:
            assert restorable.outcome(name, test) == "passed", restorable.text(name, test)


@pytest.mark.parametrize("cheat", CHEATS)
def test_a_cheat_on_the_reference_changes_only_its_worker_and_fails_every_item_as_a_mismatch(restorable, cheat):
    """Every item fails on the cheat's output: element by element, or, on a value family whose
    outputs are all within atol (the `small` family), by its relative L2 error against float64."""
    for test in ITEMS:
        text = restorable.text(cheat, test)
        assert restorable.outcome(cheat, test) == "failed", text
        assert MISMATCH in text or "ModelNew's output is wrong: relative L2 error" in text, text
    rows = [r["data"] for r in restorable.report["results"] if Path(r["data"]["workdir"]).name == cheat]
    assert len(rows) == 4 and all(not r["passed"] and r["check"] in ("mismatch", "wrong") for r in rows)
    assert WARNING not in restorable.output


@pytest.fixture(scope="module")
def dispatcher_session(prebuilt_workdir, tmp_path_factory) -> Session:
    root = tmp_path_factory.mktemp("dispatcher")
    copy_variant(prebuilt_workdir, root / "cpp_override", "cpp_override")
    copy_variant(prebuilt_workdir, root / "honest")
    # The extension's TORCH_LIBRARY_IMPL registers its sigmoid for aten::_softmax when imported.
    return judge(root, ["cpp_override", "honest"], "-m", "correctness",
                 env={"CUDAOPT_ISOLATION_OVERRIDE_AT_IMPORT": "1"})


def test_a_torch_library_impl_for_aten_changes_only_its_worker_and_fails_as_a_mismatch(dispatcher_session):
    for test in ITEMS:
        assert dispatcher_session.outcome("cpp_override", test) == "failed"
        assert MISMATCH in dispatcher_session.text("cpp_override", test)


def test_a_dispatcher_change_in_one_workdirs_worker_leaves_the_next_workdir_judged_as_it_is(dispatcher_session):
    for test in ITEMS:
        assert dispatcher_session.outcome("honest", test) == "passed", dispatcher_session.text("honest", test)
    assert dispatcher_session.report["passed"] is False  # the cheat's items


FAKE_CLOCK = """\
from pytest_cudaopt.perf.clocks import FakeClock


def pytest_cudaopt_perf_clock(config, device):
    return FakeClock({"custom": 1e-3, "compile": 3e-3, "eager": 3e-3})
"""


def judge_perf(pytester, prebuilt_workdir, monkeypatch, variant: str) -> tuple[Any, dict]:
    """The perf item alone on `variant` under the scripted clock (which passes the gate at 3x):
    pytest's result and the perf row of the report."""
    monkeypatch.setenv("CUDAOPT_SELF_TEST", "1")
    path = copy_variant(prebuilt_workdir, pytester.path / "wd", variant)
    (path / "pytest.ini").write_text(INI + "cudaopt_compile_backend = eager\ncudaopt_warmup = 0.01\n"
                                           "cudaopt_max_time = 0.5\n")
    (path / "conftest.py").write_text(FAKE_CLOCK)
    result = run_pytest(pytester, "wd", "-m", "perf", "-p", "no:benchmark", "--cudaopt-report=report.json")
    report = json.loads((pytester.path / "report.json").read_text())
    [perf] = [r["data"] for r in report["results"] if r["kind"] == "perf"]
    return result, perf


# Under the scripted clock the gate passes at 3x. reference_patch computes a sigmoid and makes
# Model compute it too: in the worker that reaches no reference, and the checked calls fail.
# override_in_forward (a kernel registered for aten::_softmax, which the baselines would run) and
# frame_peek (the harness's expected output read from the caller's frames) compute the softmax
# where neither finds anything to change or read: they are judged as the honest code they are.
@pytest.mark.parametrize("variant, passed", [("reference_patch", False), ("override_in_forward", True),
                                             ("frame_peek", True)])
def test_a_cheat_on_the_baselines_or_the_expected_outputs_moves_no_perf_verdict(
        pytester, prebuilt_workdir, monkeypatch, variant, passed):
    result, perf = judge_perf(pytester, prebuilt_workdir, monkeypatch, variant)
    result.assert_outcomes(passed=int(passed), failed=int(not passed))
    assert perf["passed"] is passed, perf
    if not passed:
        assert "custom path failed" in result.stdout.str(), result.stdout.str()
    assert WARNING not in result.stdout.str()
