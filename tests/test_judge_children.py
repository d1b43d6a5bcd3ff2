"""The judge's children: forked from the pool's zygote (torch imported there once) into `python -m pytest ...` with their own folder, environment, device, log and time limit, or executed where there is no zygote; builds that yield the CPUs."""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path

import pytest

from pytest_cudaopt.judge import pool as pool_module, runner, stages
from pytest_cudaopt.judge.devices import DeviceSet
from pytest_cudaopt.judge.options import Options
from pytest_cudaopt.run import zygote
from support import subprocess_env

ENV_TEST = """\
import os, sys, pathlib

def test_runs_in_its_folder_with_the_device_given():
    pathlib.Path("ran").write_text(os.environ["CUDA_VISIBLE_DEVICES"] + " " + str(os.getpid()))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5" and os.environ["ONLY_IN_THE_CHILD"] == "yes"
"""


def _zygote_name() -> str:
    name = os.environ.get(zygote.ENV)
    if not name:
        pytest.skip("the suite runs without its zygote (CUDAOPT_TEST_ZYGOTE=0)")
    return name


def _child(tmp_path: Path, **kwargs) -> runner.Outcome:
    (tmp_path / "test_env.py").write_text(ENV_TEST)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_env.py"]
    env = {**subprocess_env(), "CUDA_VISIBLE_DEVICES": "5", "ONLY_IN_THE_CHILD": "yes"}
    return runner.run(command, env=env, cwd=tmp_path, timeout=120, log=tmp_path / "child.log", **kwargs)


def test_a_forked_child_is_the_pytest_its_command_names_in_its_folder_and_environment(tmp_path):
    started = time.monotonic()
    outcome = _child(tmp_path, zygote_name=_zygote_name())
    log = (tmp_path / "child.log").read_text()
    assert outcome.returncode == 0 and not outcome.timed_out, log[-3000:]
    assert "1 passed" in log and "PytestAssertRewriteWarning" not in log
    device, pid = (tmp_path / "ran").read_text().split()
    assert device == "5" and int(pid) != os.getpid()
    assert time.monotonic() - started < 60


def test_a_zygote_serves_the_package_of_the_process_that_starts_it_from_any_folder(tmp_path, monkeypatch):
    """Started from a folder holding another `pytest_cudaopt` (a checkout of another version), the zygote still
    runs this process's package: else it refuses every fork and each child is a fresh Python, silently."""
    decoy = tmp_path / "checkout" / "pytest_cudaopt"
    (decoy / "run").mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "run" / "__init__.py").write_text("")
    (decoy / "run" / "zygote.py").write_text("raise SystemExit('the checkout in the folder was run')\n")
    monkeypatch.chdir(decoy.parent)
    name = f"cudaopt-test-decoy-{os.getpid()}"
    proc = zygote.start(name, subprocess_env())
    try:
        with open(tmp_path / "fork.log", "wb") as log:
            forked = zygote.spawn_module(name, "platform", [], cwd=str(tmp_path), env=subprocess_env(),
                                         log=log.fileno())
        assert forked is not None, "the zygote did not serve this package's fork"
        forked.close()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


COMPILE_THREADS = "import pathlib, torch._inductor.config as c\npathlib.Path('threads').write_text(str(c.compile_threads))\n"


def test_the_pools_zygote_and_its_children_compile_in_process_unless_the_caller_keeps_its_own_setting(
        tmp_path, monkeypatch):
    """Inductor decides its compile workers as the zygote imports it: the zygote's environment must say so too."""
    (tmp_path / "threads_probe.py").write_text(COMPILE_THREADS)
    monkeypatch.delenv(zygote.ENV, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")
    for keep, expected in (([], "1"), (["TORCHINDUCTOR_COMPILE_THREADS"], "3")):
        options = Options(fork=True, keep_env=keep, scratch=tmp_path / "scratch")
        assert stages.environment("check", DeviceSet(["0"]), "0", options).get(
            "TORCHINDUCTOR_COMPILE_THREADS") == expected
        pool = pool_module.LocalPool([], options, DeviceSet(["0"]))
        proc = pool._offer_zygote()
        assert proc is not None
        try:
            (tmp_path / "threads").unlink(missing_ok=True)
            env = {**subprocess_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_env()["PYTHONPATH"]])}
            outcome = runner.run([sys.executable, "-m", "threads_probe"], env=env, cwd=tmp_path, timeout=120,
                                 log=tmp_path / "probe.log", zygote_name=pool.options.zygote)
            assert outcome.returncode == 0, (tmp_path / "probe.log").read_text()[-2000:]
            assert (tmp_path / "threads").read_text() == expected, keep
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)


BYTECODE_PROBE = """\
import json, pathlib, sys
import probe_only_here
pathlib.Path("bytecode").write_text(json.dumps([sys.pycache_prefix, sys.dont_write_bytecode]))
"""


def test_the_pools_zygote_alone_writes_the_bytecode_folder_its_children_read(tmp_path, monkeypatch):
    """With a cache folder, the zygote writes torch's bytecode and the packages a fork imports afresh into
    `bytecode/`; a child reads it and writes nothing there (a module only it imports stays uncompiled)."""
    (tmp_path / "bytecode_probe.py").write_text(BYTECODE_PROBE)
    (tmp_path / "probe_only_here.py").write_text("VALUE = 1\n")
    monkeypatch.delenv(zygote.ENV, raising=False)
    options = Options(fork=True, cache_dir=tmp_path / "cache", scratch=tmp_path / "scratch")
    folder = (tmp_path / "cache" / "bytecode").resolve()
    # without the pool's zygote (none started, or --no-fork) a child reads its install's own bytecode
    assert "PYTHONPYCACHEPREFIX" not in stages.environment("check", DeviceSet(["0"]), "0", options)
    pool = pool_module.LocalPool([], options, DeviceSet(["0"]))
    proc = pool._offer_zygote()
    assert proc is not None
    env = stages.environment("check", DeviceSet(["0"]), "0", pool.options)
    assert env["PYTHONPYCACHEPREFIX"] == str(folder) and env["PYTHONDONTWRITEBYTECODE"] == "1"
    try:
        child_env = {**subprocess_env(), "PYTHONPYCACHEPREFIX": str(folder), "PYTHONDONTWRITEBYTECODE": "1",
                     "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_env()["PYTHONPATH"]])}
        outcome = runner.run([sys.executable, "-m", "bytecode_probe"], env=child_env, cwd=tmp_path, timeout=120,
                             log=tmp_path / "probe.log", zygote_name=pool.options.zygote)
        assert outcome.returncode == 0, (tmp_path / "probe.log").read_text()[-2000:]
        assert pool.options.zygote not in runner._UNFORKED, "the zygote forked no child"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert json.loads((tmp_path / "bytecode").read_text()) == [str(folder), True]
    written = {p.relative_to(folder) for p in folder.rglob("*.pyc")}
    named = lambda *parts: any(p.parts[-len(parts):-1] == parts[:-1] and p.name.startswith(parts[-1] + ".")
                               for p in written)
    assert named("torch", "__init__") and named("pytest_cudaopt", "judge", "pool"), sorted(written)[:20]
    assert named("hypothesis", "__init__") and not named("probe_only_here"), "a child wrote bytecode"


def test_a_sanitized_child_writes_no_bytecode():
    from pytest_cudaopt.memsafety.verdict import child_environment

    assert child_environment()["PYTHONDONTWRITEBYTECODE"] == "1"


def test_without_a_zygote_the_child_is_executed_and_says_the_same(tmp_path):
    outcome = _child(tmp_path, zygote_name=None)
    log = (tmp_path / "child.log").read_text()
    assert outcome.returncode == 0 and "1 passed" in log, log[-3000:]


def test_a_zygote_that_does_not_answer_leaves_the_child_executed_and_the_judge_says_so_once(tmp_path, capsys):
    name = f"cudaopt-no-such-zygote-{os.getpid()}-{time.monotonic_ns()}"
    outcome = _child(tmp_path, zygote_name=name)
    assert outcome.returncode == 0 and (tmp_path / "ran").exists()
    assert _child(tmp_path, zygote_name=name).returncode == 0
    said = [line for line in capsys.readouterr().err.splitlines() if name in line]
    assert len(said) == 1 and "fresh Pythons" in said[0], said


SLEEPER = "import time, pathlib\npathlib.Path('started').write_text('1')\ntime.sleep(60)\n"


def test_a_forked_childs_time_limit_ends_its_whole_group(tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    env = {**subprocess_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_env()["PYTHONPATH"]])}
    outcome = runner.run([sys.executable, "-m", "sleeper"], env=env, cwd=tmp_path, timeout=3.0, grace=1.0,
                         log=tmp_path / "sleep.log", zygote_name=_zygote_name())
    assert (tmp_path / "started").exists(), (tmp_path / "sleep.log").read_text()
    assert outcome.timed_out and outcome.returncode < 0 and 3.0 <= outcome.seconds < 10


def test_a_forked_child_dies_with_the_connection_of_the_process_that_asked_for_it(tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    env = {**subprocess_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_env()["PYTHONPATH"]])}
    with open(tmp_path / "sleep.log", "wb") as log:
        forked = zygote.spawn_module(_zygote_name(), "sleeper", [], cwd=str(tmp_path), env=env, log=log.fileno())
    assert forked is not None
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    forked.close()   # the requester goes
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(forked.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the fork outlived its requester's connection")


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
def test_a_fork_tells_whether_cuda_sees_the_devices_it_was_given(monkeypatch, initialized, count, nvml, visible,
                                                                 sees):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized, count, nvml))
    assert zygote.sees_given_devices(visible) is sees


def test_the_zygotes_imports_ask_nvml_not_cuda_for_the_devices(monkeypatch, tmp_path):
    import gc

    (tmp_path / "probe_cuda_check.py").write_text(
        "import os\nSEEN = os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.setattr(zygote, "PRELOAD", ("probe_cuda_check",))
    monkeypatch.setattr(gc, "freeze", lambda: None)   # not this test process's objects
    zygote._preload()
    assert sys.modules["probe_cuda_check"].SEEN == "1"
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ   # a fork gets the environment it was given
    sys.modules.pop("probe_cuda_check")


GPU_TEST = """import torch

def test_sees_the_device_given():
    assert torch.cuda.device_count() == 1
    assert torch.ones(4, device="cuda").sum().item() == 4
"""


@pytest.mark.gpu
@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="needs an NVIDIA GPU")
def test_a_forked_child_on_a_gpu_uses_the_device_it_is_given(tmp_path):
    (tmp_path / "test_gpu.py").write_text(GPU_TEST)
    command = [sys.executable, "-m", "pytest", "-p", "no:cudaopt", "-p", "no:cacheprovider", "-q", "test_gpu.py"]
    outcome = runner.run(command, env={**subprocess_env(), "CUDA_VISIBLE_DEVICES": "0"}, cwd=tmp_path, timeout=300,
                         log=tmp_path / "child.log", zygote_name=_zygote_name())
    log = (tmp_path / "child.log").read_text()
    assert outcome.returncode == 0 and "1 passed" in log, log[-3000:]


def test_each_stage_is_forked_from_the_pools_zygote_unless_forking_is_off(monkeypatch, tmp_path):
    seen = []

    def fake_run(command, **kwargs):
        seen.append((command[2], kwargs["zygote_name"], kwargs["nice"]))
        return runner.Outcome(0, False, 0.1, "", tmp_path / "x.log")

    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(stages, "_object_counts", lambda copy: {})
    devices = DeviceSet(["cpu0"], cpu=True)
    for fork in (True, False):
        for stage in ("build", "policy"):
            stages.run_stage(stage, tmp_path / "w", tmp_path / "out", devices, "cpu0", Options(zygote="z", fork=fork))
    assert seen == [("pytest_cudaopt.judge.child_build", "z", stages.BUILD_NICE), ("pytest", "z", 0),
                    ("pytest_cudaopt.judge.child_build", None, stages.BUILD_NICE), ("pytest", None, 0)]


def test_the_pool_forks_from_the_zygote_offered_to_it_or_starts_its_own(monkeypatch, tmp_path):
    monkeypatch.setenv(zygote.ENV, "offered")
    pool = pool_module.LocalPool([], Options(cache_dir=None), devices=DeviceSet(["cpu0"], cpu=True))
    assert pool._offer_zygote() is None and pool.options.zygote == "offered"
    monkeypatch.delenv(zygote.ENV)
    started = []
    monkeypatch.setattr(zygote, "start", lambda name, env=None: started.append(name) or "proc")
    pool = pool_module.LocalPool([], Options(cache_dir=None), devices=DeviceSet(["cpu0"], cpu=True))
    assert pool._offer_zygote() == "proc" and pool.options.zygote == started[0]


@pytest.mark.parametrize("fork", [True, False])
def test_a_build_child_yields_the_cpus_to_the_children_that_hold_a_device(tmp_path, fork):
    (tmp_path / "niceness.py").write_text("import os\nprint('niceness', os.nice(0))\n")
    env = {**subprocess_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_env()["PYTHONPATH"]])}
    base = os.nice(0)
    runner.run([sys.executable, "-m", "niceness"], env=env, cwd=tmp_path, timeout=60, log=tmp_path / "nice.log",
               nice=7, zygote_name=_zygote_name() if fork else None)
    assert f"niceness {base + 7}" in (tmp_path / "nice.log").read_text()


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
    (tmp_path / "model.py").write_text((tmp_path / "model.py").read_text().replace("x * 2", "(x * 2).exp() + 1"))
    assert check_need(tmp_path) == 4 * 2 * gib + 2 * gib + 3 * 4 * mib + gib   # x * 2, held while exp() runs
    (tmp_path / "model.py").write_text("raise RuntimeError('no meta here')\n")
    assert check_need(tmp_path) is None   # the scheduler learns it from the first check instead


def test_the_build_stage_reads_the_estimate_from_its_childs_log(tmp_path):
    from pytest_cudaopt.judge.child_build import NEED_MARK

    log = tmp_path / "build.log"
    log.write_text(f"cudaopt build: built cuda_extension\n{NEED_MARK} 2147483648\n35 tests collected\n")
    result = stages.read_build(runner.Outcome(0, False, 1.0, "", log))
    assert result.status == "ok" and result.need_bytes == 2147483648
    assert result.to_json()["need_bytes"] == 2147483648


def test_the_seconds_a_child_waits_for_its_turn_are_added_to_its_time_limit(tmp_path):
    nap = [sys.executable, "-c", "import time; time.sleep(2.0)"]
    kwargs = dict(env=subprocess_env(), cwd=tmp_path, timeout=1.0, grace=1.0, log=tmp_path / "nap.log")
    waited = runner.run(nap, paused=lambda: 1.5, **kwargs)
    assert not waited.timed_out and waited.returncode == 0
    assert runner.run(nap, **kwargs).timed_out


def test_a_perf_child_that_waits_for_its_turn_gets_at_most_one_more_time_limit(tmp_path, monkeypatch):
    from pytest_cudaopt.judge import stages
    from pytest_cudaopt.judge.devices import cpu_slots
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.run.turn import Turn

    seen = {}

    def fake_run(command, **kwargs):
        seen.update(kwargs)
        return runner.Outcome(0, False, 0.0, "", tmp_path / "perf.log")

    monkeypatch.setattr(stages.runner, "run", fake_run)
    turn = Turn(tmp_path / "turn")
    turn.asked_at = time.monotonic() - 1e6   # asked long ago, never granted: a judge that never grants
    stages.run_stage("perf", tmp_path, tmp_path, cpu_slots(1), "cpu0", Options(timeout=30.0, cache_dir=None), turn=turn)
    assert seen["env"]["CUDAOPT_TURN"] == str(tmp_path / "turn")
    assert seen["paused"]() == 30.0   # the child still ends, at twice its limit


def test_a_device_child_builds_and_starts_up_without_its_place_and_starts_no_worker_before_it(tmp_path):
    """A check child (run as the judge runs it, channel and all): it asks for its place once built, having
    touched no CUDA, and waits there with no worker (the candidate's process) started; given it, it passes."""
    import json
    import subprocess

    from support import JUDGE_CPU_ARGS, OBJECT_CACHE, judge_workdirs

    work = judge_workdirs(tmp_path / "w", ["honest"])["honest"]
    place = tmp_path / "place"
    place.mkdir()
    env = {k: v for k, v in subprocess_env().items() if k != zygote.ENV}   # its worker: a child of its own
    env.update({"CUDAOPT_PLACE": str(place), "CUDAOPT_OBJECT_CACHE": str(OBJECT_CACHE)})
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(work / "model_new.py"), "--rootdir", str(work),
                             "-m", stages.MARKERS["check"], "-p", "no:cacheprovider", "-q", *JUDGE_CPU_ARGS],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (place / "want").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert json.loads((place / "want").read_text()) == {"cuda_initialized": False, "cuda_context": False}
        assert list((work / "build").rglob("*.so")), "it asks once its extension is built"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        workers = [pid for pid in children if "pytest_cudaopt.candidate" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert workers   # launched ahead (its imports), but nothing of the workdir's loaded
        for pid in workers:
            assert str(work) not in Path(f"/proc/{pid}/maps").read_text(), "the extension loads only with a place"
        (place / "go").touch()
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]


def test_a_device_childs_limit_grows_by_its_waits_for_its_place_and_its_turn(tmp_path, monkeypatch):
    from pytest_cudaopt.judge.devices import cpu_slots
    from pytest_cudaopt.run.turn import PLACE, Turn

    seen = {}
    monkeypatch.setattr(stages.runner, "run", lambda command, **kwargs: seen.update(kwargs) or runner.Outcome(
        0, False, 0.0, "", tmp_path / "perf.log"))
    place, turn = Turn(tmp_path / "place", PLACE), Turn(tmp_path / "turn")
    place.asked_at, place.granted_at = 100.0, 104.0
    turn.asked_at, turn.granted_at = 110.0, 113.0
    stages.run_stage("perf", tmp_path, tmp_path, cpu_slots(1), "cpu0", Options(timeout=30.0, cache_dir=None),
                     turn=turn, place=place)
    assert (seen["env"]["CUDAOPT_PLACE"], seen["env"]["CUDAOPT_TURN"]) == (str(place.folder), str(turn.folder))
    assert seen["paused"]() == pytest.approx(7.0)
    place.asked_at = time.monotonic() - 1e6   # never granted: the child still ends, at twice its limit
    place.granted_at = None
    assert seen["paused"]() == 30.0


def _workers(proc) -> list[str]:
    """The candidate's worker processes among `proc`'s children."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return [pid for pid in children if "pytest_cudaopt.candidate" in Path(f"/proc/{pid}/cmdline").read_text()]


def _state(pid: str) -> str:
    """A process's state letter (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_check_child_pauses_between_items_with_its_workers_stopped_and_goes_on_when_let(tmp_path):
    """Asked to pause once placed (another workdir's turn), a real check child pauses before its next item:
    its worker (the candidate's process) stopped, no item run while paused; let go, it goes on and passes."""
    import subprocess

    from support import JUDGE_CPU_ARGS, OBJECT_CACHE, judge_workdirs

    work = judge_workdirs(tmp_path / "w", ["honest"])["honest"]
    place, pause = tmp_path / "place", tmp_path / "pause"
    place.mkdir(), pause.mkdir()
    env = {k: v for k, v in subprocess_env().items() if k != zygote.ENV}
    env.update({"CUDAOPT_PLACE": str(place), "CUDAOPT_PAUSE": str(pause), "CUDAOPT_OBJECT_CACHE": str(OBJECT_CACHE)})
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(work / "model_new.py"), "--rootdir", str(work),
                             "-m", stages.MARKERS["check"], "-p", "no:cacheprovider", "-v", *JUDGE_CPU_ARGS],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    try:
        deadline = time.monotonic() + 240
        while not (place / "want").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        (pause / "pause").write_text("1")   # asked as soon as it is placed: it pauses before its next item
        (place / "go").touch()
        while not (pause / "paused").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and (pause / "paused").read_text() == "1"
        stopped = _workers(proc)
        assert stopped and all(_state(pid) == "T" for pid in stopped), [_state(pid) for pid in stopped]
        time.sleep(1.0)
        assert proc.poll() is None and all(_state(pid) == "T" for pid in stopped)   # it stays paused until let go
        (pause / "pause").unlink()
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0 and "failed" not in output, output[-3000:]   # its worker went on too


MID_ITEM = """\
import os, pathlib, pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):   # asked once the drawn-shapes item has begun: past its pause point between items
    if item.name == "test_drawn_shapes":
        pathlib.Path(os.environ["CUDAOPT_PAUSE"], "pause").write_text("7")

def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid.endswith("test_drawn_shapes"):
        pathlib.Path(os.environ["MID_ITEM_DONE"]).write_text(report.outcome)
"""


def test_a_check_child_asked_during_a_long_item_pauses_before_its_next_case(tmp_path):
    """A turn asked while a check runs its drawn shapes waits for one case, not the item: the child pauses before
    its next case, its worker stopped, the item unfinished; let go, the item goes on and passes."""
    import subprocess

    from support import JUDGE_CPU_ARGS, OBJECT_CACHE, judge_workdirs

    work = judge_workdirs(tmp_path / "w", ["honest"])["honest"]
    pause, done = tmp_path / "pause", tmp_path / "done"
    pause.mkdir()
    (tmp_path / "mid_item.py").write_text(MID_ITEM)
    env = {k: v for k, v in subprocess_env().items() if k != zygote.ENV}
    env.update({"CUDAOPT_PAUSE": str(pause), "CUDAOPT_OBJECT_CACHE": str(OBJECT_CACHE), "MID_ITEM_DONE": str(done),
                "PYTHONPATH": os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])})
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(work / "model_new.py"), "--rootdir", str(work),
                             "-m", stages.MARKERS["check"], "-p", "no:cacheprovider", "-p", "mid_item", "-v",
                             *JUDGE_CPU_ARGS], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (pause / "paused").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None and (pause / "paused").read_text() == "7"
        assert not done.exists(), "it paused only after the item"
        stopped = _workers(proc)
        assert stopped and all(_state(pid) == "T" for pid in stopped)
        (pause / "pause").unlink()
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0 and done.read_text() == "passed", output[-3000:]


MID_PREPARATION = """\
import os, pathlib
import pytest_cudaopt.suite.perf as perf

_arrange = perf.arrange


def arrange(**kwargs):   # asked once its worker is up, in its preparation: past the item's own pause point
    pathlib.Path(os.environ["CUDAOPT_PAUSE"], "pause").write_text("3")
    return _arrange(**kwargs)


perf.arrange = arrange
"""


def test_a_perf_child_asked_while_it_prepares_pauses_with_its_workers_stopped_before_asking_for_its_turn(tmp_path):
    """Another workdir's turn waits for a preparing perf stage to pause between its steps, not for its whole
    preparation: it pauses with its worker stopped, asks for no turn while paused, and once let go it finishes
    preparing, asks for its turn and, granted, is timed."""
    import subprocess

    from support import JUDGE_CPU_ARGS, OBJECT_CACHE, judge_workdirs

    work = judge_workdirs(tmp_path / "w", ["honest"])["honest"]
    place, turn, pause = tmp_path / "place", tmp_path / "turn", tmp_path / "pause"
    for folder in (place, turn, pause):
        folder.mkdir()
    (place / "go").touch()
    (tmp_path / "mid_preparation.py").write_text(MID_PREPARATION)
    env = {k: v for k, v in subprocess_env().items() if k != zygote.ENV}
    env.update({"CUDAOPT_PLACE": str(place), "CUDAOPT_TURN": str(turn), "CUDAOPT_PAUSE": str(pause),
                "CUDAOPT_OBJECT_CACHE": str(OBJECT_CACHE), "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                                                           env["PYTHONPATH"]])})
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(work / "model_new.py"), "--rootdir", str(work),
                             "-m", stages.MARKERS["perf"], "-p", "no:cacheprovider", "-p", "mid_preparation", "-v",
                             f"--cudaopt-report={tmp_path / 'perf.json'}", *JUDGE_CPU_ARGS], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (pause / "paused").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None and (pause / "paused").read_text() == "3"
        stopped = _workers(proc)
        assert stopped and all(_state(pid) == "T" for pid in stopped)
        time.sleep(1.0)
        assert not (turn / "want").exists(), "it asked for its turn while paused"
        (pause / "pause").unlink()
        while not (turn / "want").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "it ended without asking for its turn"
        (turn / "go").touch()
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    items = json.loads((tmp_path / "perf.json").read_text())["items"]
    speed = [item for item in items if item["test"].endswith("test_speedup")]
    assert speed and speed[0]["status"] in ("passed", "failed") and "not run" not in speed[0]["reason"], output[-3000:]


def test_a_leaving_seen_late_counts_from_when_the_child_wrote_it(tmp_path, monkeypatch):
    """The judge polls; a child that leaves and exits between two polls still has its turn end at its leaving."""
    from pytest_cudaopt.run import turn as turns
    from pytest_cudaopt.run.turn import PLACE, Turn

    place, turn = Turn(tmp_path / "place", PLACE), Turn(tmp_path / "turn")
    turn.grant()
    assert not place.left() and not turn.left()
    for name, value in {**place.env, **turn.env}.items():
        monkeypatch.setenv(name, value)
    time.sleep(0.2)
    turns.leave()
    written = time.monotonic()
    time.sleep(0.5)   # seen late
    assert place.left() and turn.left()
    assert abs(turn.left_at - written) < 0.1 and 0.1 < turn.held() < 0.4


REWRITE_PROBE = '''
import json, os, sys
from _pytest.assertion.rewrite import AssertionRewritingHook


def pytest_sessionfinish(session):
    rewritten = sorted(name for name, module in sys.modules.items()
                       if name.startswith("pytest_cudaopt") and isinstance(getattr(module, "__loader__", None),
                                                                           AssertionRewritingHook))
    with open(os.environ["REWRITE_PROBE_OUT"], "w") as out:
        json.dump(rewritten, out)
'''


@pytest.mark.parametrize("rewrite", [False, True])
def test_a_judges_child_leaves_the_plugins_modules_unrewritten(tmp_path, make_workdir, rewrite):
    """pytest rewrites the asserts of every module of a plugin's package as it imports it; a child writes no
    bytecode, so each one parsed and compiled them afresh. The control (`--assert=rewrite` after `--`) shows the
    probe sees a rewrite."""
    copy = make_workdir("cpu_scale", tmp_path / "w")
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "rewrite_probe.py").write_text(REWRITE_PROBE)
    extra = ["--cudaopt-device=cpu", "-p", "rewrite_probe", *(["--assert=rewrite"] if rewrite else [])]
    command = stages.command("policy", copy, tmp_path, Options(pytest_args=extra))
    env = {**subprocess_env(), "PYTHONDONTWRITEBYTECODE": "1", "REWRITE_PROBE_OUT": str(tmp_path / "rewritten.json"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "probe"), subprocess_env().get("PYTHONPATH", "")])}
    outcome = runner.run(command, env=env, cwd=tmp_path, timeout=300, log=tmp_path / "child.log")
    assert outcome.returncode in (0, 1), (tmp_path / "child.log").read_text()[-3000:]   # 1: the copy has no lock
    rewritten = json.loads((tmp_path / "rewritten.json").read_text())
    assert bool(rewritten) == rewrite, rewritten
