"""`pytest -m correctness` end to end on CPU workdirs: an honest workdir passes, every planted cheat fails naming its cause."""

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import CHEAT_VARIANTS, copy_cheat, CPU_INI, junit_cases, run_pytest, run_python, subprocess_env

from pytest_cudaopt.launch import plugin_args

VARIANTS, INI = CHEAT_VARIANTS, CPU_INI
CANONICAL = ("test_canonical[seed0]", "test_canonical[seed1]", "test_canonical[seed2]")
DRAWN = "test_drawn_shapes"
# Workdirs judged together in one pytest session (one start-up for all; several workdirs in
# one process must not clash): "honest" is cheat_kernels' own model_new.py, the others are
# that workdir with model_new.py replaced by variants/<name>.py.
SHARED = ("honest", "canonical_only", "rejects_odd_sizes", "caches_output", "mutates_input",
          "returns_input", "returns_view", "python_matmul", "python_softmax", "python_method",
          "cpp_aten", "unwritten", "flaky", "flaky_declared", "bf16", "wrong_state", "import_error")


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
    # the ci profile's 20 draws, less those of a shape already judged (on another value family)
    assert drawn["passed"] and drawn["cases"] >= 15, drawn["cases"]
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
        "*not run: the candidate's earlier CUDA fault in wd/model_new.py::TestCorrectness::test_canonical[[]seed0] *",
    ])
    result.stdout.fnmatch_lines(["*cudaopt summary*", "*FAIL (CUDA fault)*"])


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
    from pytest_cudaopt import extension as build
    from pytest_cudaopt.suite.session import CudaoptSession
    from pytest_cudaopt.suite.settings import Settings

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
        "cudaopt build: built cuda_extension in * s (? of 3 objects compiled*): *",
    ])
