"""A KernelBench level-2 problem on the CPU (Linear, a bias added, ReLU): a derived bias_shape follows out_features, and a kernel wrong off the canonical sizes fails with its mismatch table and a replay that works."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys

import pytest

from support import junit_cases, run_python

from pytest_cudaopt.launch import plugin_args

PROBLEM = "linear_relu"  # tests/workdirs/cpu_problems/variants/linear_relu
# (workdir, model_new variant, model.py declares CUDAOPT_SHAPES: the failure is then found by a draw)
CASES = (("honest", "honest", False), ("partial", "partial_block", False),
         ("partial_declared", "partial_block", True))
DECLARED = '\n\nCUDAOPT_SHAPES = {"batch_size": (1, 16)}\n'
DRAWN = "test_drawn_shapes"


def _pytest(root, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", *args]
    return run_python(cmd[1:], cwd=root, timeout=900)


@pytest.fixture(scope="module")
def judged(prebuilt_workdir, tmp_path_factory):
    """One `pytest -m correctness` session over CASES: (root, junit cases, report, output)."""
    root = tmp_path_factory.mktemp("level2")
    src = prebuilt_workdir("cpu_problems")
    for name, variant, declared in CASES:
        dest = root / name
        shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        problem = dest / "variants" / PROBLEM
        (dest / "model.py").write_text((problem / "model.py").read_text() + (DECLARED if declared else ""))
        shutil.copyfile(problem / f"{variant}.py", dest / "model_new.py")
    (root / "pytest.ini").write_text("[pytest]\ncudaopt_device = cpu\ncudaopt_seeds = 1\n")
    done = _pytest(root, "-m", "correctness", f"--junitxml={root / 'junit.xml'}",
                   f"--cudaopt-report={root / 'report.json'}", *[f"{name}/model_new.py" for name, _, _ in CASES])
    assert (root / "junit.xml").is_file(), done.stdout + done.stderr
    return root, junit_cases(root / "junit.xml"), json.loads((root / "report.json").read_text()), done.stdout


def _drawn_result(report: dict, name: str) -> dict:
    return next(r["data"] for r in report["results"]
                if r["kind"] == "correctness" and r["data"]["workdir"].endswith(f"/{name}")
                and r["data"]["test"].endswith(DRAWN))


def test_a_bias_shape_derived_from_out_features_follows_it_and_an_honest_fused_kernel_passes(judged):
    _, cases, report, _ = judged
    outcome, text = cases[("honest", DRAWN)]
    assert outcome == "passed", text  # never out_features=1 with a bias of 24 (the reference broadcasts it)
    data = _drawn_result(report, "honest")
    assert "bias_shape = (out_features,) follow the drawn values" in data["inputs"]
    assert "out_features 1.." in data["inputs"] and "bias_shape[0]" not in data["inputs"]


@pytest.mark.parametrize("name", ["partial", "partial_declared"])
def test_a_kernel_wrong_off_the_canonical_sizes_fails_with_its_mismatch_table_not_as_tampering(judged, name):
    _, cases, report, _ = judged
    assert cases[(name, "test_canonical[seed0]")][0] == "passed"
    outcome, text = cases[(name, DRAWN)]
    assert outcome == "failed", text
    assert "candidate code changed" not in text and "isolation" not in text, text
    assert "model_new.py: ModelNew's output differs from Model's (model.py):" in text
    assert "first 5 mismatches:" in text or "mismatches:" in text
    assert "replay: pytest " in text and "--cudaopt-case=batch_size=" in text
    assert _drawn_result(report, name)["check"] == "mismatch"


def test_the_replay_line_of_a_drawn_failure_replays_it(judged):
    root, cases, _, _ = judged
    _, text = cases[("partial_declared", DRAWN)]
    line = next(line for line in text.splitlines() if line.startswith("replay: pytest "))
    done = _pytest(root, *shlex.split(line.removeprefix("replay: pytest ")))
    assert done.returncode == 1, done.stdout + done.stderr
    case = line.split("--cudaopt-case=")[1].split()[0].strip("'")
    assert "1 failed" in done.stdout and f"drawn shape {case} " in done.stdout, done.stdout
    assert "ModelNew's output differs from Model's (model.py):" in done.stdout
