"""The classic command lines: `--iters` reaches the timing engine however it is spelled, and
`--single-run` ends a failure in one line (no build, no extension, no CUDA device here)."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest
import torch

from pytest_cudaopt import extension as build, classic, cli
from pytest_cudaopt.suite.settings import BY_NAME

from support import copy_workdir, run_python, TEMPLATES


@pytest.fixture
def forwarded(monkeypatch) -> list[list[str]]:
    """The argument lists `python -m utils.profiling` hands to `cudaopt profile`/`verify`."""
    calls: list[list[str]] = []

    def fake_main(argv):
        calls.append(list(argv))
        [report] = [a.split("=", 1)[1] for a in argv if a.startswith("--cudaopt-report=")]
        timing = {"contenders": [{"key": k, "median_s": t} for k, t in
                                 (("eager", 3e-3), ("compile", 2e-3), ("custom", 1e-3))]}
        Path(report).write_text(json.dumps({"results": [{"kind": "perf", "data": {"timing": timing}}]}))
        return 0

    monkeypatch.setattr(cli, "main", fake_main)
    return calls


@pytest.mark.parametrize("spelling", [["--iters", "20"], ["--iters=20"], ["--iter=20"]])
def test_iters_sets_the_least_number_of_timed_runs_however_it_is_spelled(spelling, forwarded, tmp_path, capsys):
    assert classic.main("profiling", tmp_path, spelling) == 0
    [argv] = forwarded
    assert argv[0] == "profile" and "--cudaopt-min-runs=20" in argv
    assert "CUDA Extension: 1000.00us" in capsys.readouterr().out


def test_profiling_times_a_far_slower_kernel_in_full_unless_told_otherwise(forwarded, tmp_path) -> None:
    """It prints medians: a first kernel 20x slower than torch.compile still gets its figure."""
    classic.main("profiling", tmp_path, [])
    classic.main("profiling", tmp_path, ["--cudaopt-far-slower=5"])
    classic.main("verification", tmp_path, [])
    assert [[a for a in argv if a.startswith("--cudaopt-far-slower")] for argv in forwarded] == [
        ["--cudaopt-far-slower=0"], ["--cudaopt-far-slower=5"], []]


def test_without_iters_the_setting_decides(forwarded, tmp_path, capsys) -> None:
    classic.main("profiling", tmp_path, ["--cudaopt-max-time=1"])
    [argv] = forwarded
    assert not [a for a in argv if a.startswith("--cudaopt-min-runs")] and "--cudaopt-max-time=1" in argv


def test_the_iters_help_gives_the_default_that_applies(capsys) -> None:
    with pytest.raises(SystemExit):
        classic.main("profiling", Path("."), ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"Default: cudaopt_min_runs of the ini file or CUDAOPT_MIN_RUNS, else {BY_NAME['min_runs'].default}" in text
    assert BY_NAME["min_runs"].default == 50 and "Default: 10" not in text


def test_iters_must_be_a_positive_number(forwarded, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        classic.main("profiling", tmp_path, ["--iters=0"])
    assert exc.value.code == 2 and not forwarded
    assert "argument --iters: expected a positive whole number of runs, got '0'" in capsys.readouterr().err


def _single_run_workdir(tmp_path: Path) -> Path:
    workdir = copy_workdir("cpu_scale", tmp_path / "wd")
    shutil.copytree(TEMPLATES / "utils", workdir / "utils")
    return workdir


def test_single_run_of_a_workdir_that_does_not_build_is_one_line(tmp_path: Path) -> None:
    workdir = _single_run_workdir(tmp_path)
    (workdir / "binding.cpp").unlink()
    done = run_python(["-m", "utils.profiling", "--single-run", "cuda_extension"], cwd=workdir, timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"single run: cuda_extension does not build: cudaopt build: {workdir.resolve()} has no binding.cpp (copy it "
        "from pytest_cudaopt/templates/ or run `cudaopt init`)"]


def _built(monkeypatch, module, cuda: bool) -> None:
    monkeypatch.setattr(build, "build", lambda workdir, **kwargs: types.SimpleNamespace(cuda=cuda, module=module))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_single_run_of_a_cuda_build_without_a_cuda_device_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    _built(monkeypatch, types.SimpleNamespace(scale=lambda *a: None), cuda=True)
    assert classic.single_run(_single_run_workdir(tmp_path), ["cuda_extension"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err == ("single run: no CUDA device is visible and cuda_extension is a CUDA build "
                                         "(kernels/*.cu): run --single-run cuda_extension on a machine with a GPU\n")


def test_single_run_of_a_contender_that_raises_is_one_line_naming_the_workdir_line(tmp_path, monkeypatch,
                                                                                   capsys) -> None:
    def scale(x, weight, bias):
        raise RuntimeError("scale: x must be a CUDA tensor")

    _built(monkeypatch, types.SimpleNamespace(scale=scale), cuda=False)
    assert classic.single_run(_single_run_workdir(tmp_path), ["torch_baseline", "cuda_extension"]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[-1].startswith("single run: torch_baseline done on ")
    [line] = out.err.splitlines()
    assert line.startswith("single run: cuda_extension failed on ")
    assert line.endswith("RuntimeError: scale: x must be a CUDA tensor (at model_new.py:16 in forward: "
                         "return cuda_extension.scale(x, self.weight, self.bias))")
