"""The judge's children: pytest children started ahead of their turn (they import first, run nothing until given a device, count their time limit from then, end when their turn never comes), and builds that yield the CPUs."""

from __future__ import annotations

import io
import os
import sys
import time
import types
from pathlib import Path

import pytest

from pytest_cudaopt.judge import child_warm, pool as pool_module, runner, stages
from pytest_cudaopt.judge.devices import DeviceSet
from pytest_cudaopt.judge.options import Options
from pytest_cudaopt.judge.stages import StageResult
from support import subprocess_env

ENV_TEST = """\
import os, sys, pathlib

def test_runs_with_the_device_given_and_torch_imported_before():
    pathlib.Path("ran").write_text(os.environ["CUDA_VISIBLE_DEVICES"])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert "torch" in sys.modules
"""


def _warm_pytest(tmp_path: Path, *args: str) -> runner.Warm:
    (tmp_path / "test_env.py").write_text(ENV_TEST)
    command = [sys.executable, "-m", "pytest_cudaopt.judge.child_warm", "-p", "no:cudaopt", "-p", "no:cacheprovider",
               "-q", "test_env.py", *args]
    return runner.Warm(command, env=subprocess_env(), cwd=tmp_path, log=tmp_path / "child.log")


def test_a_warm_child_runs_pytest_only_once_it_is_given_its_device(tmp_path):
    warm = _warm_pytest(tmp_path)
    time.sleep(1.0)
    assert warm.proc.poll() is None and not (tmp_path / "ran").exists()   # waiting, nothing run
    outcome = warm.go("5", timeout=300)
    log = (tmp_path / "child.log").read_text()
    assert outcome.returncode == 0 and not outcome.timed_out, log[-3000:]
    assert (tmp_path / "ran").read_text() == "5" and "1 passed" in log


def test_a_warm_childs_time_limit_counts_from_its_turn(tmp_path):
    sleeper = [sys.executable, "-c", "import sys, time; sys.stdin.readline(); time.sleep(60)"]
    warm = runner.Warm(sleeper, env=subprocess_env(), cwd=tmp_path, log=tmp_path / "child.log")
    time.sleep(2.0)   # longer than its limit: only the time after `go` counts
    outcome = warm.go("0", timeout=1.0, grace=1.0)
    assert outcome.timed_out and 1.0 <= outcome.seconds < 1.9
    assert warm.proc.poll() is not None


def test_a_warm_child_whose_turn_never_comes_is_ended_without_running_anything(tmp_path):
    children = runner.Children()
    warm = _warm_pytest(tmp_path)
    warm.children = children
    children.add(warm.proc)
    warm.cancel()
    assert warm.proc.returncode in (child_warm.NOT_GIVEN, -15)
    assert not (tmp_path / "ran").exists() and not children._procs


def test_a_child_whose_cuda_saw_no_device_starts_afresh_with_its_device(monkeypatch):
    execs = []
    monkeypatch.setattr(child_warm, "preload", lambda: None)
    monkeypatch.setattr(child_warm, "sees_given_devices", lambda visible: False)
    monkeypatch.setattr(sys, "stdin", io.StringIO("2\n"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def fake_exec(path, argv):
        execs.append((argv, os.environ["CUDA_VISIBLE_DEVICES"]))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_exec)
    with pytest.raises(SystemExit):
        child_warm.main(["model_new.py", "-m", "perf"])
    assert execs == [([sys.executable, "-m", "pytest", "model_new.py", "-m", "perf"], "2")]


def _fake_torch(initialized: bool, count: int, nvml: int) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(_is_compiled=lambda: True, is_initialized=lambda: initialized,
                                       _device_count_nvml=lambda: nvml)
    torch._C = types.SimpleNamespace(_cuda_getDeviceCount=lambda: count)
    return torch


@pytest.mark.parametrize("initialized, count, nvml, visible, sees", [
    (False, 1, 1, "0", True),     # CUDA first asked now: it sees the device given
    (False, 0, 1, "0", False),    # its device count was taken before, while nothing was visible
    (True, 1, 1, "0", False),     # torch initialised CUDA before the device was given
    (False, 0, 0, "", True),      # a CPU slot: nothing to see
    (False, 0, -1, "5", True),    # no GPU on this machine at all (no NVML either): nothing to see
])
def test_a_child_tells_whether_cuda_sees_the_devices_it_was_given(monkeypatch, initialized, count, nvml, visible,
                                                                  sees):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized, count, nvml))
    assert child_warm.sees_given_devices(visible) is sees


def test_the_imports_ahead_ask_nvml_not_cuda_for_the_devices(monkeypatch, tmp_path):
    (tmp_path / "probe_cuda_check.py").write_text(
        "import os\nSEEN = os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.setattr(child_warm, "PRELOAD", ("probe_cuda_check",))
    child_warm.preload()
    assert sys.modules["probe_cuda_check"].SEEN == "1"
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ   # the run proper gets the environment it was given
    sys.modules.pop("probe_cuda_check")


GPU_TEST = """import torch

def test_sees_the_device_given():
    assert torch.cuda.device_count() == 1
    assert torch.ones(4, device="cuda").sum().item() == 4
"""


@pytest.mark.gpu
@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="needs an NVIDIA GPU")
def test_a_warm_child_on_a_gpu_uses_the_device_it_is_given(tmp_path):
    (tmp_path / "test_gpu.py").write_text(GPU_TEST)
    command = [sys.executable, "-m", "pytest_cudaopt.judge.child_warm", "-p", "no:cudaopt", "-p", "no:cacheprovider",
               "-q", "test_gpu.py"]
    warm = runner.Warm(command, env=subprocess_env(), cwd=tmp_path, log=tmp_path / "child.log")
    outcome = warm.go("0", timeout=300)
    log = (tmp_path / "child.log").read_text()
    assert outcome.returncode == 0 and "starting afresh" not in log, log[-3000:]


def test_a_warm_command_is_the_cold_one_through_child_warm(tmp_path):
    cold = stages.command("perf", tmp_path / "w", tmp_path / "out", Options())
    warm = stages.command("perf", tmp_path / "w", tmp_path / "out", Options(), warm=True)
    assert cold[1:3] == ["-m", "pytest"] and warm[1:3] == ["-m", "pytest_cudaopt.judge.child_warm"]
    assert warm[3:] == cold[3:]


class _FakeWarm:
    def __init__(self, stage: str, log: list):
        self.stage, self.log, self.cancelled = stage, log, False

    def cancel(self) -> None:
        self.cancelled = True
        self.log.append(("cancel", self.stage))


def test_the_pool_starts_each_stages_child_while_the_stage_before_runs(monkeypatch, tmp_path):
    """honest goes through every stage on children started ahead; wrong fails its check, and the
    perf child started for it is ended."""
    log: list = []
    warms: list[_FakeWarm] = []

    def fake_prestart(stage, copy, out, devices, options, children=None):
        warms.append(_FakeWarm(stage, log))
        log.append(("prestart", copy.name, stage))
        return warms[-1]

    def fake_run_stage(stage, copy, out, devices, device, options, children=None, warm=None):
        log.append(("run", copy.name, stage, warm.stage if warm is not None else None))
        failed = copy.name == "wrong" and stage == "check"
        return StageResult(stage, "failed" if failed else "ok", 0.01, device=device)

    monkeypatch.setattr(pool_module, "prestart", fake_prestart)
    monkeypatch.setattr(pool_module, "run_stage", fake_run_stage)
    for name in ("honest", "wrong"):
        (tmp_path / "src" / name).mkdir(parents=True)
        (tmp_path / "src" / name / "model.py").write_text("x = 1\n")
    workdirs = [tmp_path / "src" / "honest", tmp_path / "src" / "wrong"]
    options = Options(jobs=1, cache_dir=None, scratch=tmp_path / "scratch", pytest_args=["--cudaopt-device=cpu"])
    found = list(pool_module.LocalPool(workdirs, options, devices=DeviceSet(["cpu0"], cpu=True)).lines())
    assert len(found) == 2
    for name in ("honest", "wrong"):
        runs = [entry for entry in log if entry[0] == "run" and entry[1] == name]
        assert all(given in (None, stage) for _, _, stage, given in runs)
        assert [given for *_, given in runs][1:] == [stage for _, _, stage, _ in runs][1:]   # every later stage warm
        for _, _, stage, _ in runs[:-1]:   # its successor started before the stage ran
            following = stages_after(stage)
            assert log.index(("prestart", name, following)) < log.index(next(e for e in runs if e[2] == stage))
    deadline = time.monotonic() + 5   # the pool ends unused children on a thread of their own
    while not any(w.cancelled for w in warms) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [w.stage for w in warms if w.cancelled] == ["perf"]   # wrong's perf never came


def stages_after(stage: str) -> str:
    from pytest_cudaopt.judge.scheduler import STAGES

    return STAGES[STAGES.index(stage) + 1]


def test_a_build_child_yields_the_cpus_to_the_children_that_hold_a_device(monkeypatch, tmp_path):
    probe = [sys.executable, "-c", "import os; print('niceness', os.nice(0))"]
    base = os.nice(0)
    runner.run(probe, env=subprocess_env(), cwd=tmp_path, timeout=60, log=tmp_path / "nice.log", nice=7)
    assert f"niceness {base + 7}" in (tmp_path / "nice.log").read_text()
    seen = {}

    def fake_run(command, **kwargs):
        seen[command[2]] = kwargs["nice"]
        return runner.Outcome(0, False, 0.1, "", tmp_path / "x.log")

    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(stages, "_object_counts", lambda copy: {})
    for stage in ("build", "policy"):
        stages.run_stage(stage, tmp_path / "w", tmp_path / "out", DeviceSet(["cpu0"], cpu=True), "cpu0", Options())
    assert seen == {"pytest_cudaopt.judge.child_build": stages.BUILD_NICE, "pytest": 0}


def test_a_workdir_named_out_keeps_its_copy_apart_from_the_childrens_outputs(tmp_path):
    job = pool_module.Job(0, tmp_path / "src" / "out", tmp_path / "scratch" / "00000", None)
    assert job.copy != job.out and job.out.parent == job.copy.parent


def test_the_build_child_estimates_one_checks_memory_from_the_reference_on_meta(tmp_path):
    """1 GiB of inputs and 1 GiB of outputs, a 4 MiB weight: 4 x 2 GiB + 2 GiB + 3 x 4 MiB. Nothing is allocated."""
    from pytest_cudaopt.judge.child_build import check_need

    (tmp_path / "model.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.w = nn.Parameter(torch.ones(1024, 1024))\n\n"
        "    def forward(self, x):\n        return x * 2\n\n\n"
        "def get_inputs():\n    return [torch.randn(256, 1024, 1024)]\n\n\ndef get_init_inputs():\n    return []\n")
    gib, mib = 1 << 30, 1 << 20
    assert check_need(tmp_path) == 4 * 2 * gib + 2 * gib + 3 * 4 * mib
    (tmp_path / "model.py").write_text("raise RuntimeError('no meta here')\n")
    assert check_need(tmp_path) is None   # the scheduler learns it from the first check instead


def test_the_build_stage_reads_the_estimate_from_its_childs_log(tmp_path):
    from pytest_cudaopt.judge.child_build import NEED_MARK

    log = tmp_path / "build.log"
    log.write_text(f"cudaopt build: built cuda_extension\n{NEED_MARK} 2147483648\n35 tests collected\n")
    result = stages.read_build(runner.Outcome(0, False, 1.0, "", log))
    assert result.status == "ok" and result.need_bytes == 2147483648
    assert result.to_json()["need_bytes"] == 2147483648
