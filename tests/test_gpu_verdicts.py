"""The verdicts on a real GPU against CUDA kernels that misbehave: unwritten output, a fault, a race. The attacks on the speed verdict (side streams, patched event timers) are in tests/exploits/."""

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from support import PREBUILT_ROOT, WORKDIRS, junit_cases, run_pytest, subprocess_env

from pytest_cudaopt.launch import plugin_args

# Every test here runs CUDA kernels: without a CUDA device the plugin skips them with its reason.
pytestmark = pytest.mark.gpu

WORKDIR = "cuda_cheats"
VARIANTS = WORKDIRS / WORKDIR / "variants"
# The pytest sessions judged here: the ci profile with 5 drawn shapes, and a watchdog that ends a
# hung kernel well before the session's own timeout.
CORRECTNESS = ("-m", "correctness", "--cudaopt-device=cuda", "--cudaopt-profile=ci",
               "--cudaopt-max-examples=5", "--cudaopt-timeout=120")
SESSION_TIMEOUT = 300
INI = "[pytest]\n"  # pins the rootdir, so node ids read wd/model_new.py::...
CANONICAL = ("test_canonical[seed0]", "test_canonical[seed1]", "test_canonical[seed2]")
DRAWN = "test_drawn_shapes"
# Workdirs judged together in one correctness session: "honest" is cuda_cheats' own
# model_new.py, the others are that workdir with model_new.py replaced by variants/<name>.py.
SHARED = ("honest", "unwritten", "flaky")


def copy_cheat(prebuilt_workdir, dest: Path, variant: str = "honest") -> Path:
    """A copy of the built cuda_cheats workdir at `dest`, with model_new.py replaced by
    variants/<variant>.py (the extension stays built: the copy builds in about a second)."""
    src = prebuilt_workdir(WORKDIR)
    with FileLock(str(PREBUILT_ROOT / f"{WORKDIR}.lock")):
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    if variant != "honest":
        shutil.copyfile(VARIANTS / f"{variant}.py", dest / "model_new.py")
    return dest


def report_results(path: Path) -> list[dict]:
    """The `data` of every result in a --cudaopt-report file."""
    return [rec["data"] for rec in json.loads(path.read_text())["results"]]


@dataclass
class Verdicts:
    """The outcome of one correctness session over the SHARED workdirs on the GPU."""

    output: str
    cases: dict[tuple[str, str], tuple[str, str]]
    results: list[dict]

    def outcome(self, workdir: str, test: str) -> str:
        return self.cases[(workdir, test)][0]

    def text(self, workdir: str, test: str) -> str:
        return self.cases[(workdir, test)][1]

    def result(self, workdir: str, case_prefix: str) -> dict:
        for data in self.results:
            if Path(data["workdir"]).name == workdir and data["case"].startswith(case_prefix):
                return data
        raise KeyError(f"no result {case_prefix!r} for {workdir} in the report")


@pytest.fixture(scope="module")
def verdicts(prebuilt_workdir, tmp_path_factory) -> Verdicts:
    root = tmp_path_factory.mktemp("gpu_verdicts")
    for name in SHARED:
        copy_cheat(prebuilt_workdir, root / name, name)
    (root / "pytest.ini").write_text(INI)
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", *CORRECTNESS,
           f"--junitxml={root / 'junit.xml'}", f"--cudaopt-report={root / 'report.json'}",
           *[f"{name}/model_new.py" for name in SHARED]]
    done = subprocess.run(cmd, cwd=root, env=subprocess_env(), capture_output=True, text=True,
                          timeout=SESSION_TIMEOUT)
    output = done.stdout + done.stderr
    assert (root / "junit.xml").is_file() and (root / "report.json").is_file(), output
    return Verdicts(output, junit_cases(root / "junit.xml"), report_results(root / "report.json"))


@pytest.fixture
def cuda_cheat(pytester, prebuilt_workdir):
    """`cuda_cheat(variant, name="wd")`: pytester.path/<name>, the built cuda_cheats workdir
    with variants/<variant>.py as its model_new.py."""
    pytester.makeini(INI)

    def make(variant: str = "honest", name: str = "wd") -> Path:
        return copy_cheat(prebuilt_workdir, pytester.path / name, variant)

    return make


# -- one correctness session: an honest kernel and two cheats -------------------------------------

def test_it_passes_an_honest_cuda_kernel_on_every_seed_and_drawn_shape(verdicts):
    for test in (*CANONICAL, DRAWN):
        assert verdicts.outcome("honest", test) == "passed", verdicts.text("honest", test)
    # The session ran on a GPU, with the workdir's inputs on it.
    assert re.search(r"^cudaopt: torch .*, GPU .+ \(sm_\d+\)", verdicts.output, re.MULTILINE), verdicts.output
    assert "device cuda" in verdicts.output
    canonical = verdicts.result("honest", "canonical seed0")
    assert canonical["passed"] and canonical["inputs"] == "x: float32[16, 64]"
    assert canonical["precision"]["tier"] == "fp32"
    drawn = verdicts.result("honest", "drawn shapes")
    assert drawn["passed"] and drawn["cases"] >= 3, drawn
    assert drawn["precision"]["tier"] == "fp32"


def test_it_fails_a_cuda_kernel_that_leaves_part_of_the_output_unwritten_naming_the_nan_elements(verdicts):
    for test in (*CANONICAL, DRAWN):
        assert verdicts.outcome("unwritten", test) == "failed", verdicts.text("unwritten", test)
    text = verdicts.text("unwritten", "test_canonical[seed0]")
    assert "ModelNew's output differs from Model's (model.py)" in text
    # The last column of all 16 rows: the NaN the output was filled with before the call.
    assert "output: 16 of 1024 elements (1.56%) outside" in text
    assert "NaN where the other is not: 16 elements" in text
    assert re.search(r"\[0, 63\]\s+actual\s+nan\s+expected", text), text
    assert re.search(r"\[4, 63\]\s+actual\s+nan\s+expected", text), text
    assert "output elements the candidate never wrote" in text
    assert verdicts.result("unwritten", "canonical seed0")["check"] == "mismatch"


def test_it_fails_a_cuda_kernel_that_gives_different_results_on_two_runs(verdicts):
    for test in (*CANONICAL, DRAWN):
        assert verdicts.outcome("flaky", test) == "failed", verdicts.text("flaky", test)
    text = verdicts.text("flaky", "test_canonical[seed0]")
    assert "two runs of ModelNew on the same inputs differ in 1 of 1024 elements of output (first at [0, 0]:" in text
    assert "CUDAOPT_NONDETERMINISTIC = True" in text
    for seed in range(3):
        assert verdicts.result("flaky", f"canonical seed{seed}")["check"] == "nondeterministic"


def test_the_summary_prints_one_correctness_table_for_the_gpu_workdirs(verdicts):
    assert "cudaopt summary" in verdicts.output
    assert "cudaopt correctness: 4 of 12 passed" in verdicts.output
    assert len(verdicts.results) == 12


# -- sessions of their own -----------------------------------------------------------------------

def test_an_illegal_memory_access_fails_its_item_and_the_later_items_report_the_fault(pytester, cuda_cheat):
    cuda_cheat("fault")
    result = run_pytest(pytester, "wd/model_new.py", *CORRECTNESS, "--junitxml=junit.xml", timeout=SESSION_TIMEOUT)
    result.assert_outcomes(failed=1, errors=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([
        "*CUDA fault on case canonical inputs of get_inputs(), seed *; inputs x: float32[[]16, 64]:",
        "*ModelNew.forward raised:",
        "*an illegal memory access was encountered*",
        "*The CUDA context of this process is now unusable*",
        "*compute-sanitizer pytest 'wd/model_new.py::TestCorrectness::test_canonical[[]seed0]' --cudaopt-seed=*",
    ])
    cases = junit_cases(pytester.path / "junit.xml")
    outcome, text = cases[("wd", "test_canonical[seed0]")]
    assert outcome == "failed" and "CUDA fault on case canonical inputs" in text, text
    # The later items do not touch the lost context: each reports the fault by its own line.
    for test in (*CANONICAL[1:], DRAWN):
        outcome, text = cases[("wd", test)]
        assert outcome == "error", text
        assert ("not run: the candidate's earlier CUDA fault in wd/model_new.py::TestCorrectness::test_canonical[seed0] "
                "left the CUDA context unusable: ") in text, text
        assert "an illegal memory access was encountered" in text.split("unusable: ", 1)[1], text
    result.stdout.fnmatch_lines([
        "*= cudaopt summary =*",
        "cudaopt correctness: 0 of 1 passed",
        "wd *canonical seed0 *FAIL (CUDA fault)",
    ])


def test_the_cuda_extension_fixture_runs_a_cuda_kernel_in_the_worker(pytester, cuda_cheat):
    """The owner's kernel test calls the extension through the fixture: CUDA tensors go to the
    worker and back, the result is right, and the .so never loads into the pytest process."""
    cuda_cheat("honest", ".")  # the rootdir is the workdir, as in the repository's own tests
    pytester.makepyfile(test_kernel="""
        import torch

        def test_scale(cuda_extension):
            x = torch.randn(64, 32, device="cuda")
            w, b = torch.randn(32, device="cuda"), torch.randn(32, device="cuda")
            out = cuda_extension.scale(x, w, b, config=0)
            assert out.is_cuda and torch.allclose(out, x * w + b, rtol=1e-5, atol=1e-5)  # an FMA or not
            assert "cuda_extension" not in open("/proc/self/maps").read()
    """)
    result = run_pytest(pytester, "test_kernel.py", timeout=SESSION_TIMEOUT)
    result.assert_outcomes(passed=1)
