"""Isolation end to end on the CPU isolation workdir: a candidate that makes the reference compute its sigmoid (from model_new.py, from C++ through pybind11::exec, through the dispatcher, by a global flag) fails, in the correctness and the perf items alike."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from support import PREBUILT_ROOT, WORKDIRS, junit_cases, run_pytest, subprocess_env

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
    import subprocess

    from pytest_cudaopt.launch import plugin_args

    (root / "pytest.ini").write_text(INI)
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", *args,
           f"--junitxml={root / 'junit.xml'}", f"--cudaopt-report={root / 'report.json'}",
           *[f"{name}/model_new.py" for name in names]]
    done = subprocess.run(cmd, cwd=root, env={**subprocess_env(), **(env or {})}, capture_output=True, text=True,
                          timeout=900)
    output = done.stdout + done.stderr
    assert (root / "junit.xml").is_file(), output
    return Session(output, junit_cases(root / "junit.xml"), json.loads((root / "report.json").read_text()))


# The workdirs of one session: Python attributes and flags are put back once found, so the
# honest workdir judged after the cheats passes.
RESTORABLE = ["honest", "python_patch", "exec_patch", "flag_in_forward", "reference_patch", "reference_code",
              "global_hook", "honest_after"]


@pytest.fixture(scope="module")
def restorable(prebuilt_workdir, tmp_path_factory) -> Session:
    root = tmp_path_factory.mktemp("isolation")
    for name in RESTORABLE:
        copy_variant(prebuilt_workdir, root / name, "honest" if name.startswith("honest") else name)
    return judge(root, RESTORABLE, "-m", "correctness")


def test_the_honest_workdir_passes_before_and_after_the_cheats(restorable):
    for name in ("honest", "honest_after"):
        for test in ITEMS:
            assert restorable.outcome(name, test) == "passed", restorable.text(name, test)


def test_a_torch_softmax_replaced_by_model_new_py_fails_every_item_naming_it_and_the_line(restorable):
    text = restorable.text("python_patch", "test_canonical[seed0]")
    assert restorable.outcome("python_patch", "test_canonical[seed0]") in ("failed", "error")
    assert f"{WARNING} (found after importing model_new.py)" in text
    line = next(n for n, t in enumerate((VARIANTS / "python_patch.py").read_text().splitlines(), 1)
                if t.startswith("torch.softmax ="))
    assert "attribute torch.softmax: was <built-in method softmax" in text and f"(defined in model_new.py:{line})" in text
    for test in ITEMS[1:]:
        assert restorable.outcome("python_patch", test) in ("failed", "error")


def test_a_torch_softmax_replaced_from_cpp_through_pybind11_exec_fails_naming_the_road(restorable):
    text = restorable.text("exec_patch", "test_canonical[seed0]")
    assert f"{WARNING} (found after importing model_new.py)" in text
    assert "attribute torch.softmax" in text and "defined in <string>:2: Python code without a file of its own " \
                                                "(pybind11::exec or eval in kernels/" in text
    assert all(restorable.outcome("exec_patch", test) in ("failed", "error") for test in ITEMS)


def test_a_global_flag_changed_by_a_call_fails_before_the_reference_runs(restorable):
    for test in ITEMS:
        assert restorable.outcome("flag_in_forward", test) == "failed"
    text = restorable.text("flag_in_forward", "test_canonical[seed0]")
    assert "found after ModelNew(...) was built and called, before the reference ran" in text
    assert "flag torch.get_float32_matmul_precision(): was 'highest', now 'medium'" in text
    assert "case: canonical inputs of get_inputs()" in text
    rows = [r["data"] for r in restorable.report["results"] if Path(r["data"]["workdir"]).name == "flag_in_forward"]
    assert len(rows) == 4 and all(not r["passed"] and r["check"] == "isolation" for r in rows)


def test_the_references_forward_replaced_through_nn_modules_subclasses_fails_every_item(restorable):
    """A wrong candidate whose constructor makes Model compute what it computes: every check would agree."""
    line = next(n for n, t in enumerate((VARIANTS / "reference_patch.py").read_text().splitlines(), 1)
                if "cls.forward = " in t)
    for test in ITEMS:
        assert restorable.outcome("reference_patch", test) == "failed", restorable.text("reference_patch", test)
        text = restorable.text("reference_patch", test)
        assert "found after ModelNew(...) was built and called, before the reference ran" in text
        assert "attribute model.Model.forward: was <function Model.forward" in text
        assert f"(defined in model_new.py:{line})" in text


def test_the_references_forward_keeping_its_identity_with_its_code_replaced_fails_every_item(restorable):
    line = next(n for n, t in enumerate((VARIANTS / "reference_code.py").read_text().splitlines(), 1)
                if t.startswith("def _sigmoid_forward"))
    for test in ITEMS:
        assert restorable.outcome("reference_code", test) in ("failed", "error"), restorable.text("reference_code", test)
    text = restorable.text("reference_code", "test_canonical[seed0]")
    assert f"{WARNING} (found after importing model_new.py)" in text
    assert f"attribute model.Model.forward: the same function, its __code__ replaced (defined in model_new.py:{line})" \
        in text


def test_a_forward_hook_on_every_module_that_rewrites_the_references_output_fails_every_item(restorable):
    for test in ITEMS:
        assert restorable.outcome("global_hook", test) == "failed", restorable.text("global_hook", test)
    text = restorable.text("global_hook", "test_canonical[seed0]")
    assert "flag the global nn.Module hooks: was none, now _global_forward_hooks: _hook" in text


@pytest.fixture(scope="module")
def dispatcher_session(prebuilt_workdir, tmp_path_factory) -> Session:
    root = tmp_path_factory.mktemp("dispatcher")
    copy_variant(prebuilt_workdir, root / "cpp_override", "cpp_override")
    copy_variant(prebuilt_workdir, root / "honest")
    # The extension's TORCH_LIBRARY_IMPL registers its sigmoid for aten::_softmax when imported.
    return judge(root, ["cpp_override", "honest"], "-m", "correctness",
                 env={"CUDAOPT_ISOLATION_OVERRIDE_AT_IMPORT": "1"})


def test_a_torch_library_impl_for_aten_fails_the_import_naming_the_op_the_key_and_the_source_line(dispatcher_session):
    text = dispatcher_session.text("cpp_override", "test_canonical[seed0]")
    assert f"{WARNING} (found after importing cuda_extension, built from kernels/)" in text
    line = next(n for n, t in enumerate((WORKDIRS / "cpu_isolation" / "kernels" / "softmax_binding.cpp")
                                        .read_text().splitlines(), 1) if t.startswith("TORCH_LIBRARY_IMPL(aten, CPU"))
    assert (f"dispatcher aten::_softmax / CPU: a kernel registered at ../../../kernels/softmax_binding.cpp:{line} "
            f"(defined in kernels/softmax_binding.cpp:{line})") in text


def test_a_dispatcher_change_that_cannot_be_undone_leaves_no_later_verdict_standing(dispatcher_session):
    for test in ITEMS:
        assert dispatcher_session.outcome("honest", test) in ("failed", "error")
    text = dispatcher_session.text("honest", "test_canonical[seed0]")
    assert "not run: an earlier item found that candidate code in " in text
    assert "changed dispatcher aten::_softmax / CPU" in text and "cannot be put back" in text
    assert dispatcher_session.report["passed"] is False


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


def test_a_kernel_registered_for_aten_by_the_first_call_fails_the_perf_item_before_the_baselines_run(
        pytester, prebuilt_workdir, monkeypatch):
    """The baselines would dispatch to the candidate's kernel."""
    result, perf = judge_perf(pytester, prebuilt_workdir, monkeypatch, "override_in_forward")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"FAIL: {WARNING} (found after ModelNew's first calls, before the baselines were compiled):",
        "  dispatcher aten::_softmax / CPU: a kernel registered at ../../../kernels/softmax_binding.cpp:*",
    ])
    assert perf["passed"] is False and WARNING in perf["failure"]


def test_a_forward_that_reads_the_callers_frames_fails_the_perf_item_naming_the_read_and_its_line(
        pytester, prebuilt_workdir, monkeypatch):
    """The variant returns the harness's own expected output of each checked timed call, found
    through sys._getframe: every comparison would agree."""
    result, perf = judge_perf(pytester, prebuilt_workdir, monkeypatch, "frame_peek")
    result.assert_outcomes(failed=1)
    line = next(n for n, t in enumerate((VARIANTS / "frame_peek.py").read_text().splitlines(), 1)
                if "sys._getframe(1)" in t)
    result.stdout.fnmatch_lines(["*candidate code read the interpreter's frames*",
                                 f"  sys._getframe() at model_new.py:{line}*"])
    assert perf["passed"] is False and "sys._getframe() at model_new.py" in perf["failure"]


def test_a_constructor_that_makes_the_reference_compute_its_output_fails_the_perf_item(
        pytester, prebuilt_workdir, monkeypatch):
    """Under the scripted clock the gate passes at 3x; every timed call's check would agree with
    a reference that computes the candidate's sigmoid."""
    result, perf = judge_perf(pytester, prebuilt_workdir, monkeypatch, "reference_patch")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{WARNING}*", "  attribute model.Model.forward: was <function Model.forward*"])
    assert perf["passed"] is False and WARNING in perf["failure"]
