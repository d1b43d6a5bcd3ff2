"""benchmarks/judge_gallery.py in its CPU smoke mode: both arms run the same CPU workdirs and agree on every verdict."""

from __future__ import annotations

import json
import subprocess
import sys

from support import JUDGE_CACHE, REPO_ROOT, subprocess_env


def test_the_gallery_benchmark_runs_on_cpu_and_both_arms_agree(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "judge_gallery.py"), "--smoke",
                           "--out", str(tmp_path), "--cache-dir", str(JUDGE_CACHE), "--pytest-cache"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verdicts: the same for every workdir" in proc.stdout
    assert "workdirs/hour" in proc.stdout and "time by stage" in proc.stdout
    found = json.loads((tmp_path / "judge_gallery.json").read_text())
    verdicts = {name: r["passed"] for name, r in found["pytest"]["results"].items()}
    assert verdicts == {"cpu_scale-honest": True, "cpu_scale-wrong": False, "cpu_scale-build_error": False}
    assert found["judge"]["results"]["cpu_scale-build_error"]["status"] == "build-failed"
