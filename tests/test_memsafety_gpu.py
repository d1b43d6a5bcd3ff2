"""The memory-safety item on a real GPU under the real compute-sanitizer: a write past the output, a shared-memory race and an uninitialised read each fail naming their line; the honest kernel and this repository's own workdir pass."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from support import PREBUILT_ROOT, REPO_ROOT, WORKDIRS, junit_cases, subprocess_env

from pytest_cudaopt.memsafety.verdict import find_sanitizer
from pytest_cudaopt.launch import plugin_args

pytestmark = pytest.mark.gpu

WORKDIR = "cuda_memsafety"
VARIANTS = WORKDIRS / WORKDIR / "variants"
ITEM = "test_memory_safety"
# Each fault, the tool that must name it, and the comment on the line it must name.
FAULTS = {
    "past_end": ("memcheck", "the write memcheck must name"),
    "race": ("racecheck", "the race racecheck must name"),
    "uninit": ("initcheck", "the read initcheck must name"),
}


@pytest.fixture(scope="module", autouse=True)
def sanitizer():
    found, where = find_sanitizer()
    if found is None:
        pytest.skip(f"compute-sanitizer not found (looked in {where})")
    return found


def marked_line(comment: str) -> int:
    lines = (WORKDIRS / WORKDIR / "kernels" / "memsafety.cu").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if comment in line)


def judge(root: Path, names, *args: str) -> tuple[str, dict, list[dict]]:
    (root / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-m", "memsafety", "-rA",
           f"--junitxml={root / 'junit.xml'}", f"--cudaopt-report={root / 'report.json'}", *args,
           *[f"{name}/model_new.py" for name in names]]
    done = subprocess.run(cmd, cwd=root, env=subprocess_env(), capture_output=True, text=True, timeout=1800)
    output = done.stdout + done.stderr
    assert (root / "junit.xml").is_file(), output
    records = [r["data"] for r in json.loads((root / "report.json").read_text())["results"]]
    return output, junit_cases(root / "junit.xml"), records


@pytest.fixture(scope="module")
def faults(prebuilt_workdir, tmp_path_factory):
    root = tmp_path_factory.mktemp("memsafety")
    src = prebuilt_workdir(WORKDIR)
    for name in ("honest", *FAULTS):
        with FileLock(str(PREBUILT_ROOT / f"{WORKDIR}.lock")):
            shutil.copytree(src, root / name, symlinks=True, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        if name != "honest":
            shutil.copyfile(VARIANTS / f"{name}.py", root / name / "model_new.py")
    return judge(root, ["honest", *FAULTS])


def test_the_honest_kernel_passes_all_three_tools(faults):
    output, cases, records = faults
    assert cases[("honest", ITEM)][0] == "passed", cases[("honest", ITEM)][1]
    [honest] = [r for r in records if Path(r["workdir"]).name == "honest"]
    assert honest["tools"] == {"memcheck": "clean", "racecheck": "clean", "initcheck": "clean"}, honest


@pytest.mark.parametrize("variant", sorted(FAULTS))
def test_each_fault_fails_naming_its_tool_and_line(faults, variant):
    output, cases, records = faults
    tool, comment = FAULTS[variant]
    outcome, text = cases[(variant, ITEM)]
    assert outcome == "failed", text
    assert f"kernels/memsafety.cu:{marked_line(comment)}" in text and f": {tool}: " in text, text


def test_this_repositorys_workdir_passes_and_says_how_long_it_took(tmp_path):
    """The GPT-2 attention workdir at the repository's root, as the integrator runs it."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-m",
                           "memsafety", "-rA", f"--cudaopt-report={tmp_path / 'memsafety.json'}", "model_new.py"],
                          cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    [record] = [r["data"] for r in json.loads((tmp_path / "memsafety.json").read_text())["results"]]
    print(f"memory safety of the repository's workdir: {wall:.0f} s wall, {record['seconds']:.0f} s in the "
          f"sanitizer, case {record['case']}, tools {record['tools']}, notes {record['notes']}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert record["passed"] and record["tools"]["memcheck"] == "clean"
