"""The GitHub Actions workflow: actionlint finds nothing, and the steps call files that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def test_actionlint_finds_nothing_in_the_workflows():
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not on PATH (pip install -e '.[lint]'; the workflow's CPU job does)")
    done = subprocess.run([actionlint, "-no-color"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


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
