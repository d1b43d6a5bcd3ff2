"""The plugin's basics: report header, GPU skips, loading installed or from a checkout, --help."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from pytest_cudaopt.suite import settings

REPO_ROOT = Path(__file__).resolve().parents[1]


def _device_words() -> str:
    return "no CUDA device" if not torch.cuda.is_available() else "GPU * (sm_*)"


def test_the_report_header_names_torch_cuda_the_device_and_the_arch(pytester, run_pytest, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run_pytest(pytester, "--cudaopt-device=cuda")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"cudaopt: torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, {_device_words()}, "
        f"arch sm_90a (from TORCH_CUDA_ARCH_LIST=9.0a)",
        "cudaopt: seed * (replay with --cudaopt-seed=*), device cuda, hypothesis profile ci",
    ])


def test_a_project_without_a_workdir_sees_no_cudaopt_lines_and_no_torch(pytester, run_pytest):
    pytester.makepyfile("import sys\n\ndef test_no_torch():\n    assert 'torch' not in sys.modules\n")
    result = run_pytest(pytester, fork=False)   # a fresh process: the fork server has torch imported
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if line.startswith("cudaopt:")], result.stdout.str()


def test_a_workdir_found_by_collection_prints_the_header_after_collection(pytester, run_pytest):
    (pytester.path / "sub" / "wd").mkdir(parents=True)
    (pytester.path / "sub" / "wd" / "model.py").write_text("")
    (pytester.path / "sub" / "wd" / "model_new.py").write_text("")
    result = run_pytest(pytester, "--collect-only")
    result.stdout.fnmatch_lines(["cudaopt: torch *", "cudaopt: seed *"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: GPU tests run")
def test_it_skips_gpu_tests_with_a_reason_without_a_device(pytester, run_pytest):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu
        def test_needs_a_gpu():
            raise AssertionError("ran without a GPU")

        def test_runs_anywhere():
            pass
    """)
    result = run_pytest(pytester, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no CUDA device visible (torch.cuda.is_available() is False)"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: GPU tests run")
def test_it_skips_a_workdirs_correctness_items_without_a_device(pytester, run_pytest, copy_workdir):
    copy_workdir("cpu_scale", pytester.path)
    result = run_pytest(pytester, "model_new.py", "-m", "correctness", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 1 and not outcomes.get("passed") and not outcomes.get("failed"), \
        result.stdout.str()
    result.stdout.fnmatch_lines(["SKIPPED * no CUDA device visible (torch.cuda.is_available() is False); kernels "
                                 "written as C++ for the CPU are judged here with --cudaopt-device=cpu "
                                 f"(`pytest {pytester.path} --cudaopt-device=cpu`, or cudaopt_device = \"cpu\" in "
                                 "the workdir's pyproject.toml, as `cudaopt init --device cpu` writes)"])


def _fake_installation(root: Path) -> Path:
    """A dist-info folder declaring the plugin's pytest11 entry point, as `pip install` writes it."""
    site = root / "site"
    info = site / "pytest_cudaopt_entry-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pytest-cudaopt-entry\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\ncudaopt = pytest_cudaopt.plugin\n")
    return site


PLUGIN_PROBE = """
import pytest_cudaopt.plugin as plugin


def test_the_plugin_is_registered_once(request, cudaopt_settings):
    names = [name for name, p in request.config.pluginmanager.list_name_plugin() if p is plugin]
    print("REGISTERED", names)
    assert len(names) == 1
    assert cudaopt_settings.device == "cpu"
"""


@pytest.mark.parametrize("installed", [False, True], ids=["checkout", "installed"])
def test_the_plugin_loads_once_from_a_checkout_or_through_its_entry_point(pytester, subprocess_env, installed):
    # The repo's root conftest.py is what loads the plugin from a checkout.
    shutil.copy(REPO_ROOT / "conftest.py", pytester.path / "conftest.py")
    pytester.makepyfile(test_probe=PLUGIN_PROBE)
    pythonpath = subprocess_env["PYTHONPATH"]
    args = ["-s", "--cudaopt-device=cpu"]
    if installed:
        pythonpath = f"{_fake_installation(pytester.path)}:{pythonpath}"
    else:
        args += ["-p", "no:cudaopt"]  # a real installation's entry point must not load it here
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", pythonpath)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=1)
    name = "cudaopt" if installed else "pytest_cudaopt.plugin"
    assert f"REGISTERED ['{name}']" in result.stdout.str()
    headers = [line for line in result.outlines if line.startswith("cudaopt: torch ")]
    assert len(headers) == 1, result.stdout.str()


def test_help_lists_every_cudaopt_option_and_ini_key(pytester, run_pytest, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps the help text to the terminal width
    result = run_pytest(pytester, "--help")
    assert result.ret == 0
    text = result.stdout.str()
    for option in settings.OPTIONS:
        if option.cli and option.is_flag:  # a plain flag, and its --cudaopt-no-* twin
            for flag in (option.flag, option.off_flag):
                assert re.search(rf"^  {flag}\b(?!=)", text, re.M), f"{flag} missing from --help"
        elif option.cli:
            assert f"  {option.flag}=" in text, f"{option.flag} missing from --help"
        if option.ini:
            assert f"  {option.ini_key} (" in text, f"ini key {option.ini_key} missing from --help"
    result.stdout.fnmatch_lines([
        "cudaopt: judge a CUDA extension workdir:",
        "  --cudaopt-device=CUDAOPT_DEVICE",
        "                        device the workdir's inputs live on; 'cpu' for workdirs",
        "                        whose kernels are C++ CPU code (env CUDAOPT_DEVICE;",
        "                        default: cuda)",
    ])


@pytest.mark.parametrize("worker, devices, expected", [
    ("gw0", 4, 0), ("gw5", 4, 1), ("gw1", 1, None), ("master", 4, None),
])
def test_each_xdist_worker_is_pinned_to_its_own_gpu(monkeypatch, worker, devices, expected):
    import torch

    from pytest_cudaopt.primitives.environment import pin_worker_to_gpu

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert pin_worker_to_gpu(worker) == expected
    assert chosen == ([] if expected is None else [expected])


def test_importing_the_plugin_imports_no_torch(subprocess_env):
    import subprocess
    import sys

    probe = "import sys, pytest_cudaopt.plugin; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    done = subprocess.run([sys.executable, "-c", probe], env=subprocess_env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("python_files", [None, "model_new.py", "wd/model_new.py"])
def test_a_workdir_found_by_collection_is_collected_once_whatever_python_files_says(
        pytester, run_pytest, copy_workdir, python_files):
    copy_workdir("cpu_scale", pytester.path / "wd")
    if python_files:
        pytester.makeini(f"[pytest]\npython_files = test_*.py {python_files}\n")
    result = run_pytest(pytester, "--collect-only", "-q", "--cudaopt-device=cpu")
    ids = [line for line in result.outlines if line.startswith("wd/model_new.py::")]
    assert ids and len(ids) == len(set(ids)), result.stdout.str()
    assert "wd/model_new.py::TestPerf::test_speedup" in ids


def test_python_files_patterns_match_the_name_or_the_end_of_the_path(tmp_path):
    from pytest_cudaopt.suite.collection import matches_python_files as _matches_python_files

    path = tmp_path / "wd" / "model_new.py"
    assert _matches_python_files(path, ["test_*.py", "model_*.py"])
    assert _matches_python_files(path, ["wd/model_new.py"])
    assert not _matches_python_files(path, ["test_*.py", "other/model_new.py"])
