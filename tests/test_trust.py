"""The trust boundary: relaxations in force are printed in the header and the JSON report."""

from __future__ import annotations

import json

from support import copy_workdir
from pytest_cudaopt import policy
from pytest_cudaopt.suite import settings
from pytest_cudaopt.results import relaxations as trust


def test_the_strict_defaults_relax_nothing():
    assert trust.setting_relaxations(settings.Settings({})) == []


def test_every_looser_setting_is_a_relaxation():
    loose = settings.Settings({"atol": 0.1, "rtol": 0.001, "min_speedup": 1.0, "seeds": 1,
                               "allow_ops": "aten::mm", "nondeterministic": True,
                               "gate": "precision-matched", "self_test": True})
    lines = trust.setting_relaxations(loose)
    assert lines[:4] == ["atol 0.1 (default 0.01)", "min_speedup 1 (default 1.05)", "seeds 1 (default 3)",
                         "allow_ops aten::mm (ATen ops the op audit lets through)"]
    assert not any(line.startswith("rtol") for line in lines)  # tighter is no relaxation
    assert any(line.startswith("gate precision-matched") for line in lines)
    assert any(line.startswith("self_test") for line in lines)
    assert any(line.startswith("nondeterministic") for line in lines)


def test_a_workdirs_disabled_rules_and_allow_lists_are_relaxations(tmp_path):
    workdir = copy_workdir("cpu_scale", tmp_path / "wd")
    (workdir / "pyproject.toml").write_text(
        '[tool.cudaopt]\ndisable = ["KC005", "MN003"]\nallow-includes = ["cub/"]\n')
    assert trust.workdir_relaxations(workdir) == ["disabled rules KC005, MN003", "allow-includes cub/"]


def test_the_header_and_the_json_report_list_the_relaxations(pytester, run_pytest):
    workdir = copy_workdir("cpu_scale", pytester.path / "wd")
    (workdir / "pyproject.toml").write_text('[tool.cudaopt]\ndisable = ["KC005"]\n')
    policy.write_lock(workdir)
    result = run_pytest(pytester, "wd", "-m", "policy", "--cudaopt-min-speedup=1.0",
                        "--cudaopt-report=report.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "cudaopt: RELAXED (2): setting min_speedup 1 (default 1.05); *wd: disabled rules KC005"])
    doc = json.loads((pytester.path / "report.json").read_text())
    assert doc["relaxations"] == ["setting min_speedup 1 (default 1.05)",
                                  f"{workdir.resolve()}: disabled rules KC005"]
