"""The two ways a worker starts: executed (`python -m pytest_cudaopt.candidate FD`) and forked by a zygote that imported torch once (run/zygote.py). Both must give the candidate the same process: the same working directory, environment, imports, output relay; and neither may outlive the judging process."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_cudaopt.remote.worker import Worker
from pytest_cudaopt.run import zygote
from support import run_pytest, subprocess_env

MODEL = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2
def get_inputs():
    return [torch.randn(4)]
def get_init_inputs():
    return []
"""

# What the candidate's process looks like from inside, on its output (the worker's log).
MODEL_NEW = """
import json, os, sys, tempfile
import torch
print("model_new.py imported", flush=True)
json.dump({"cwd": os.getcwd(), "path0": sys.path[0], "env": sorted(os.environ), "tmp": tempfile.gettempdir(),
           "session_leader": os.getsid(0) == os.getpid(), "stdin": sys.stdin.read(),
           "argv": sys.argv}, sys.stdout)
print(flush=True)
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x * 2
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "model.py").write_text(MODEL)
    (wd / "model_new.py").write_text(MODEL_NEW)
    return wd


@pytest.fixture(scope="module")
def zygote_name():
    name = f"cudaopt-test-start-{secrets.token_hex(4)}"
    proc = zygote.start(name, subprocess_env())
    yield name
    proc.stdin.close()
    proc.wait(timeout=30)


def _started(workdir: Path, monkeypatch, name: str | None) -> tuple[Worker, dict]:
    if name is None:
        monkeypatch.delenv(zygote.ENV, raising=False)
    else:
        monkeypatch.setenv(zygote.ENV, name)
    worker = Worker(workdir, None, "cpu").start()
    seen = json.loads(next(line for line in worker.last_words(1 << 20).splitlines() if line.startswith("{")))
    return worker, seen


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_forked_worker_is_the_process_an_executed_one_is(workdir, monkeypatch, zygote_name):
    executed, seen_executed = _started(workdir, monkeypatch, None)
    forked, seen_forked = _started(workdir, monkeypatch, zygote_name)
    try:
        assert isinstance(forked.proc, zygote.Forked) and isinstance(executed.proc, subprocess.Popen)
        for seen, worker in ((seen_executed, executed), (seen_forked, forked)):
            assert Path(seen.pop("cwd")) == worker.scratch.resolve()
            # its temporary files in its scratch folder (a zygote's imports may have chosen another)
            assert Path(seen.pop("tmp")).resolve() == worker.scratch.resolve()
            assert seen["session_leader"] and seen["stdin"] == ""
            assert not any(key.startswith(("CUDAOPT_", "PYTEST_")) for key in seen["env"])
            assert "model_new.py imported" in worker.last_words()
            assert worker.ping() < 5
        assert seen_forked == seen_executed  # sys.path, environment, argv, session
        assert forked.confined == executed.confined and forked.confined.get("held")  # the same sandbox
        assert seen_forked["argv"] == seen_executed["argv"]
        # A fork, not a fresh Python the fork executed (what a zygote whose imports touched CUDA does).
        assert b"pytest_cudaopt.run.zygote" in Path(f"/proc/{forked.proc.pid}/cmdline").read_bytes().split(b"\0")
    finally:
        executed.stop()
        forked.stop()
    assert not forked.alive() and not executed.alive()


def test_a_forked_worker_dies_when_its_judging_process_does_and_the_next_worker_removes_its_scratch(
        workdir, zygote_name):
    # A judging process that starts a worker and dies without stopping it (SIGKILL: no atexit).
    script = textwrap.dedent(f"""
        import os, signal, sys
        from pytest_cudaopt.remote.worker import Worker
        from pytest_cudaopt.run import zygote
        worker = Worker({str(workdir)!r}, None, "cpu").start()
        assert isinstance(worker.proc, zygote.Forked), type(worker.proc)
        print("pid", worker.proc.pid, "scratch", worker.scratch, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**subprocess_env(), zygote.ENV: zygote_name}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    pid = int(done.stdout.split("pid ")[1].split()[0])
    assert done.returncode == -9
    assert _gone(pid, within=10), f"worker {pid} outlived the process that asked for it"
    left = Path(done.stdout.split("scratch ")[1].split()[0])
    assert left.is_dir()   # nothing of the dead process's ran to remove it ...
    Worker(workdir, None, "cpu").launch().stop()
    assert not left.exists(), f"{left}: the next worker of this host left a dead judging process's scratch"


def test_without_a_zygote_at_the_address_the_worker_is_executed(workdir, monkeypatch):
    worker, seen = _started(workdir, monkeypatch, f"cudaopt-test-nobody-{secrets.token_hex(4)}")
    try:
        assert isinstance(worker.proc, subprocess.Popen)
        assert Path(seen["cwd"]) == worker.scratch.resolve() and worker.ping() < 5
    finally:
        worker.stop()


def test_a_zygote_whose_starter_is_gone_ends_and_takes_its_workers(workdir, monkeypatch):
    name = f"cudaopt-test-end-{secrets.token_hex(4)}"
    proc = zygote.start(name, subprocess_env())
    worker, _ = _started(workdir, monkeypatch, name)
    try:
        assert isinstance(worker.proc, zygote.Forked)
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert _gone(worker.proc.pid, within=10)
        assert worker.proc.wait(timeout=10) == -9
    finally:
        worker.stop()


def test_the_judges_pool_offers_its_stage_children_a_zygote_of_its_own(workdir, monkeypatch, tmp_path):
    """`cudaopt judge` on a host without one starts a zygote for its pool: every stage child's
    environment names it, so their workers are forked; the pool ends it when it ends."""
    from pytest_cudaopt.judge import stages
    from pytest_cudaopt.judge.devices import cpu_slots
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool

    monkeypatch.delenv(zygote.ENV, raising=False)
    options = Options(pytest_args=["--cudaopt-device=cpu"])
    assert LocalPool([], options, run_stage=lambda *a, **k: None)._offer_zygote() is None  # stages not real children
    pool = LocalPool([], options)
    proc = pool._offer_zygote()
    assert proc is not None and pool.options.zygote and options.zygote is None
    try:
        env = stages.environment("check", cpu_slots(1), None, pool.options)
        assert env[zygote.ENV] == pool.options.zygote
        monkeypatch.setenv(zygote.ENV, env[zygote.ENV])
        worker = Worker(workdir, None, "cpu").start()
        try:
            assert isinstance(worker.proc, zygote.Forked) and worker.ping() < 5
        finally:
            worker.stop()
        assert LocalPool([], options)._offer_zygote() is None  # one offered already: kept
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


POISONING_ZYGOTE = """
import sys
import torch
from pytest_cudaopt.run import zygote

# What an import may do on a GPU host: ask CUDA itself for its devices, after which torch calls
# every fork of this process a bad one.
torch._C._cuda_getDeviceCount()
sys.exit(zygote.serve(sys.argv[1]))
"""


def test_a_zygote_whose_imports_touched_cuda_executes_its_forks_afresh(workdir, monkeypatch, tmp_path):
    script = tmp_path / "poisoning_zygote.py"
    script.write_text(POISONING_ZYGOTE)
    name = f"cudaopt-test-poisoned-{secrets.token_hex(4)}"
    proc = subprocess.Popen([sys.executable, str(script), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=subprocess_env(), start_new_session=True)
    proc.stdout.readline()
    try:
        worker, seen = _started(workdir, monkeypatch, name)
        try:
            assert isinstance(worker.proc, zygote.Forked) and worker.ping() < 5
            assert "model_new.py imported" in worker.last_words()
            assert (Path(f"/proc/{worker.proc.pid}/cmdline").read_bytes().split(b"\0")[1:3]
                    == [b"-m", b"pytest_cudaopt.candidate"])   # executed by the fork: a process CUDA can use
        finally:
            worker.stop()
        from pytest_cudaopt.judge import runner

        (tmp_path / "probe.py").write_text("import sys\nprint('argv', sys.argv[1:], 'fresh', 'torch' not in sys.modules)\n")
        env = {**subprocess_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), subprocess_env()["PYTHONPATH"]])}
        outcome = runner.run([sys.executable, "-m", "probe", "x"], env=env, cwd=tmp_path, timeout=60,
                             log=tmp_path / "probe.log", zygote_name=name)
        assert outcome.returncode == 0 and "argv ['x'] fresh True" in (tmp_path / "probe.log").read_text()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


# -- launched ahead (session.workers.launch): the worker's start beside the judging process's own --

def _session(tmp_path: Path, **values):
    from pytest_cudaopt.suite.session import CudaoptSession
    from pytest_cudaopt.suite.settings import Settings

    return CudaoptSession(Settings({"device": "cpu", **values}), rootpath=tmp_path)


def test_a_worker_launched_ahead_is_the_one_the_workdir_then_loads_in(workdir, tmp_path, monkeypatch):
    monkeypatch.delenv(zygote.ENV, raising=False)
    session = _session(tmp_path)
    session.workers.launch(workdir)
    try:
        [launched] = session.workers.all
        assert launched.alive() and launched.builds == workdir / "build" / "cudaopt"
        taken = session.workers.start(workdir, None)
        assert taken is launched and session.workers.all == [launched]  # no second process
        assert "model_new.py imported" in taken.last_words() and taken.confined.get("mode") == "auto"
        # Only once: a second start of the workdir is a fresh worker.
        again = session.workers.start(workdir, None)
        assert again is not launched and again.alive()
    finally:
        session.workers.stop()
    assert not launched.alive()


def test_a_worker_launched_before_its_place_makes_its_context_when_asked_and_then_starts_as_any(
        workdir, tmp_path, monkeypatch):
    """A judge's child launches its worker before its place: the sandbox request asks for no CUDA context; a perf
    child asks for it once placed, before its turn (make_context), and the workdir then loads in that worker."""
    from pytest_cudaopt.run.turn import PLACE

    monkeypatch.delenv(zygote.ENV, raising=False)
    monkeypatch.setenv(PLACE, str(tmp_path / "place"))   # no `go` there: the place is pending
    sent = []
    original = Worker.send
    monkeypatch.setattr(Worker, "send", lambda self, message, **kw: sent.append(message) or original(self, message, **kw))
    session = _session(tmp_path)
    session.workers.launch(workdir)
    try:
        [launched] = session.workers.all
        assert sent[0]["op"] == "sandbox" and sent[0]["context"] is False
        session.workers.make_context(workdir)
        assert [m["op"] for m in sent] == ["sandbox", "context"]
        session.workers.make_context(workdir)   # once
        assert len(sent) == 2
        taken = session.workers.start(workdir, None)
        assert taken is launched and "model_new.py imported" in taken.last_words()
        assert taken.confined.get("mode") == "auto"   # the sandbox reply, taken early, still confines it
    finally:
        session.workers.stop()


def test_a_launched_worker_is_kept_from_a_request_it_does_not_fit(workdir, tmp_path):
    session = _session(tmp_path)
    session.workers.launch(workdir)
    [launched] = session.workers.all
    try:
        assert launched.reads(workdir / "build" / "cudaopt" / "key" / "cuda_extension.so")
        assert not launched.reads(tmp_path / "elsewhere" / "cuda_extension.so")
        assert session.workers.take_launched(workdir, tmp_path / "elsewhere" / "cuda_extension.so", "cpu") is None
        assert not launched.alive()  # stopped, not left running
        session.workers.launch(workdir)
        # The policy items' worker on another device leaves it to the workdir's own.
        assert session.workers.take_launched(workdir, None, "cuda") is None and session.workers.launched[workdir].alive()
        assert session.workers.take_launched(workdir, None, "cpu") is session.workers.all[-1]
    finally:
        session.workers.stop()


def test_a_build_root_outside_the_workdir_is_made_before_the_launch_that_reads_it(workdir, tmp_path):
    session = _session(tmp_path, build_dir=str(tmp_path / "builds"))
    session.workers.launch(workdir)
    try:
        [launched] = session.workers.all
        assert (tmp_path / "builds").is_dir() and launched.builds == (tmp_path / "builds").resolve()
    finally:
        session.workers.stop()


def test_launching_a_worker_imports_no_torch_in_the_judging_process(workdir, tmp_path):
    # The launch's point: the worker's torch import runs beside this process's, not before it.
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from pytest_cudaopt.suite.session import CudaoptSession
        from pytest_cudaopt.suite.settings import Settings
        session = CudaoptSession(Settings({{"device": "cpu"}}), rootpath=Path({str(tmp_path)!r}))
        session.workers.launch(Path({str(workdir)!r}))
        print("launched", len(session.workers.all), session.workers.all[0].alive(), "torch" in sys.modules)
        session.workers.stop()
    """)
    env = {k: v for k, v in subprocess_env().items() if k != zygote.ENV}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "launched 1 True False" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("markexpr", ["", "correctness", "perf", "policy", "not perf", "not policy",
                                      "correctness or perf or memsafety", "not correctness and not perf",
                                      "(policy or perf) and not gpu", "gpu", "not (gpu or perf)",
                                      "policy and perf or correctness", "not not policy"])
def test_the_mark_expression_is_read_as_pytest_reads_it(markexpr):
    from _pytest.mark.expression import Expression

    from pytest_cudaopt.suite.collection import keeps

    for marks in ({"correctness", "gpu"}, {"perf", "gpu"}, {"perf"}, {"policy"}):
        expected = Expression.compile(markexpr).evaluate(lambda name, **kwargs: name in marks) if markexpr else True
        assert keeps(markexpr, marks) is expected, marks


@pytest.mark.parametrize("markexpr", ["slow(reason=1)", "a and (b", "or perf"])
def test_a_mark_expression_it_cannot_read_launches_the_worker_anyway(markexpr):
    from pytest_cudaopt.suite.collection import keeps

    assert keeps(markexpr, {"perf"}) is None  # worker_ahead counts None as kept: a worker unused at worst


def test_the_worker_is_launched_ahead_only_where_this_process_will_run_the_judged_items(monkeypatch):
    from types import SimpleNamespace

    from pytest_cudaopt.suite import collection

    def config(markexpr: str = "", **option):
        options = {"numprocesses": None, "collectonly": False, "help": False, "version": False, **option}
        return SimpleNamespace(option=SimpleNamespace(**options),
                               getoption=lambda name, default=None: markexpr if name == "markexpr" else default)

    assert collection.worker_ahead(config(), "cpu") and collection.worker_ahead(config("not policy"), "cpu")
    assert not collection.worker_ahead(config("policy or build"), "cpu")
    assert collection.worker_ahead(config("not gpu"), "cpu")               # no gpu mark on the CPU
    assert not collection.worker_ahead(config(numprocesses=2), "cpu")      # pytest-xdist's controller
    assert not collection.worker_ahead(config(collectonly=True), "cpu")
    worker = config()
    worker.workerinput = {"workerid": "gw0"}                                # one of its workers
    assert not collection.worker_ahead(worker, "cpu")
    monkeypatch.setattr(collection.os.path, "exists", lambda path: True)    # a CUDA driver
    assert collection.worker_ahead(config(), "cuda") and not collection.worker_ahead(config("not gpu"), "cuda")
    monkeypatch.setattr(collection.os.path, "exists", lambda path: path != "/dev/nvidiactl")
    assert not collection.worker_ahead(config(), "cuda")                    # no driver: its items skip


def test_pytest_launches_the_named_workdirs_worker_at_configure_and_its_first_item_takes_it(pytester, cheat):
    cheat()
    pytester.makeconftest("""
        import pytest

        def _session(config):
            from pytest_cudaopt.plugin import SESSION_KEY
            return config.stash[SESSION_KEY]

        def pytest_collection_finish(session):
            launched = _session(session.config).workers.launched
            print("launched:", sorted(path.name for path, w in launched.items() if w.alive()), flush=True)

        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionfinish(session):
            found = _session(session.config)
            print("workers:", len(found.workers.all), "not taken:", len(found.workers.launched), flush=True)
    """)
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "-s")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["launched: ['wd']", "*workers: 1 not taken: 0*"])  # the one launched, taken
    result = run_pytest(pytester, "wd/model_new.py", "-m", "policy", "-s")
    result.stdout.fnmatch_lines(["launched: []"])


def test_hold_stops_the_workers_and_a_sanitized_case_running_beside_the_items_and_counts_the_seconds():
    """Workers.hold (a check paused for another workdir's turn): every live worker's process group and every
    child of a memory-safety case begun at load stop, and go on; the case's limit grows by the seconds held."""
    import signal
    import subprocess
    import time
    import types

    from pytest_cudaopt.remote.workers import Workers

    def state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
             for _ in range(2)]
    try:
        workers = Workers(types.SimpleNamespace())
        workers.all.append(types.SimpleNamespace(proc=procs[0], alive=lambda: procs[0].poll() is None))
        child = types.SimpleNamespace(proc=procs[1])
        begun = types.SimpleNamespace(sanitized=types.SimpleNamespace(children={"memcheck": child}))
        workers.keep_begun(Path("wd"), begun)
        workers.hold(True)
        time.sleep(0.3)
        assert [state(p.pid) for p in procs] == ["T", "T"]
        workers.hold(False)
        time.sleep(0.1)
        assert "T" not in [state(p.pid) for p in procs]
        taken, held = workers.begun_for(Path("wd"))
        assert taken is begun and 0.3 <= held() < 5.0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
