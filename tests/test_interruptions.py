"""Results that survive every fault: SIGINT and SIGTERM to pytest or its process group, hangs from an item's first line (imports, the build), a crash on a drawn shape, a build folder that cannot be written. Each test reads the files on disk once every process is gone."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import forkserver
from support import junit_cases, run_pytest, server, subprocess_env

from pytest_cudaopt import extension as build
from pytest_cudaopt.launch import plugin_args

CPU_INI = "[pytest]\ncudaopt_device = cpu\ncudaopt_compile_backend = eager\ncudaopt_warmup = 0.01\n"
CANONICAL = "wd/model_new.py::TestCorrectness::test_canonical[seed0]"
# ModelNew of the cpu_scale workdir, with a line put in front of its forward's return.
MODEL_NEW = '''\
import ctypes
import os
import time

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        {line}
        return cuda_extension.scale(x, self.weight, self.bias)
'''
# Printed by a forward that is about to hang: the signal is sent once the item is in its call. The
# worker may write nothing but its own scratch folder (under the TMPDIR run_group gives pytest),
# where its output goes (worker.log), so the test looks for the line there.
STARTED = 'print("cudaopt-test-started", flush=True); time.sleep(3600)'


def _started(path: Path) -> Callable[[], bool]:
    def started() -> bool:
        for log in (path / "tmp").glob("cudaopt-worker-*/worker.log"):
            try:
                if "cudaopt-test-started" in log.read_text(errors="replace"):
                    return True
            except OSError:
                pass
        return False

    return started


@dataclass
class Ended:
    ret: int
    stdout: str
    stderr: str
    path: Path

    def report(self) -> dict:
        return json.loads((self.path / "r.json").read_text())

    def cases(self) -> dict:
        return junit_cases(self.path / "j.xml")


def _wait_until_gone(pgid: int, seconds: float = 60) -> None:
    """Until no process of the group is left (the sentinel included): files are final then."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)
    pytest.fail(f"processes of group {pgid} were still alive {seconds} s after pytest ended")


def run_group(path: Path, *args: str, signal_when=None, signum=None, group: bool = True,
              env: dict | None = None, timeout: float = 300) -> Ended:
    """pytest in its own process group in `path`; `signal_when()` true: send `signum` to pytest
    or to its whole group. Returns once every process of the group is gone."""
    args = ["-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", *args]
    (path / "tmp").mkdir(exist_ok=True)
    env = {**subprocess_env(), "TMPDIR": str(path / "tmp"), **(env or {})}
    child = _Child(args, path, env)
    deadline = time.monotonic() + timeout
    try:
        if signal_when is not None:
            while not signal_when():
                assert child.poll() is None, "pytest ended before the signal was sent"
                assert time.monotonic() < deadline, "the item never started"
                time.sleep(0.1)
            os.killpg(child.pid, signum) if group else os.kill(child.pid, signum)
        ret = child.wait(max(1.0, deadline - time.monotonic()))
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        raise
    _wait_until_gone(child.pid)
    return Ended(ret, (path / "out.txt").read_text(), (path / "err.txt").read_text(), path)


class _Child:
    """`python *args` in `path` in a session of its own, its output in out.txt and err.txt: a
    fork of the suite's fork server (support.run_python), or a plain subprocess with
    CUDAOPT_TEST_FORK=0."""

    def __init__(self, args: list[str], path: Path, env: dict):
        self.status = None
        if forkserver.enabled():
            self.server = server()
            self.pid = self.server.start(args, cwd=path, env=env, stdout=path / "out.txt", stderr=path / "err.txt",
                                         python=True, new_session=True)
            return
        self.server = None
        self.proc = subprocess.Popen([sys.executable, *args], cwd=path, env=env, stdout=open(path / "out.txt", "w"),
                                     stderr=open(path / "err.txt", "w"), start_new_session=True)
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.wait(0)

    def wait(self, timeout: float) -> int | None:
        if self.server is None:
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                if timeout:
                    raise
                return None
        if self.status is None:
            self.status = self.server.wait(timeout)
            if self.status is None and timeout:
                raise subprocess.TimeoutExpired(f"pytest (pid {self.pid})", timeout)
        return self.status


@pytest.fixture
def workdir(tmp_path, make_workdir):
    """`workdir(line)`: the built cpu_scale workdir at tmp_path/wd, `line` in front of the
    return of ModelNew.forward."""

    def make(line: str = "pass") -> Path:
        path = make_workdir("cpu_scale", dest=tmp_path / "wd")
        (tmp_path / "pytest.ini").write_text(CPU_INI)
        (path / "model_new.py").write_text(MODEL_NEW.format(line=line))
        return path

    return make


# -- SIGINT and SIGTERM ----------------------------------------------------------------------

@pytest.mark.parametrize("signum, group, marker", [
    (signal.SIGTERM, True, "correctness"), (signal.SIGTERM, False, "correctness"),
    (signal.SIGINT, True, "correctness"), (signal.SIGINT, False, "perf"),
], ids=["sigterm-group", "sigterm-pid", "sigint-group", "sigint-pid-perf"])
def test_a_signal_leaves_the_junit_file_the_report_and_the_summary_and_exits_2(tmp_path, workdir, signum,
                                                                                group, marker):
    workdir(STARTED)
    ended = run_group(tmp_path, "wd/model_new.py", "-m", f"{marker} or policy", "--cudaopt-report=r.json",
                      "--junitxml=j.xml", signal_when=_started(tmp_path), signum=signum, group=group)
    name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT (Ctrl-C)"
    assert ended.ret == 2, ended.stdout + ended.stderr
    running = CANONICAL if marker == "correctness" else "wd/model_new.py::TestPerf::test_speedup"
    doc = ended.report()
    assert (doc["passed"], doc["complete"], doc["cause"], doc["reason"]) == (False, False, "interrupted",
                                                                             f"interrupted by {name}")
    assert doc["blame"] is None and all(item["blame"] is None for item in doc["items"])   # no one's fault
    assert doc["running"] == running
    statuses = {item["test"]: item["status"] for item in doc["items"]}
    assert statuses.pop(running) == "failed" and set(statuses.values()) == {"not run"}
    cases = ended.cases()
    outcome, text = cases[("wd", running.split("::")[-1])]
    assert outcome == "failed" and text.startswith(f"INTERRUPTED: interrupted by {name} while this test ran")
    if marker == "correctness":
        assert "on case canonical inputs of get_inputs()" in text and "replay: pytest " in text
    later = [o for (_, test), (o, t) in cases.items() if test != running.split("::")[-1]]
    assert later and set(later) == {"skipped"}
    assert "= cudaopt summary =" in ended.stdout and "cudaopt: NOT PASSED (1 failed, " in ended.stdout
    assert f"incomplete: interrupted by {name}" in ended.stdout
    assert "from the sentinel" not in ended.stderr  # pytest ended its own session
    assert "Traceback" not in ended.stdout


def test_an_interrupt_that_code_caught_and_discarded_still_ends_the_run_as_interrupted(tmp_path, workdir):
    """C code that calls Python may discard the KeyboardInterrupt raised in it (torch.compile's does, about
    one time in ten while it compiles): Model's forward stands in for it. The interrupt is raised again
    after the baseline's compile, or as the item ends: never lost."""
    path = workdir()
    model = (path / "model.py").read_text()
    swallow = ("    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
               "        import os, signal, time\n"
               "        if not LOST:\n"
               "            LOST.append(1)\n"
               "            try:\n"
               "                os.kill(os.getpid(), signal.SIGINT)\n"
               "                time.sleep(5)\n"
               "            except KeyboardInterrupt:\n"
               "                pass\n")
    model = model.replace("    def forward(self, x: torch.Tensor) -> torch.Tensor:\n", swallow, 1)
    (path / "model.py").write_text("LOST = []\n" + model)
    ended = run_group(tmp_path, "wd/model_new.py", "-m", "perf", "--cudaopt-report=r.json", "--junitxml=j.xml")
    assert ended.ret == 2, ended.stdout + ended.stderr
    doc = ended.report()
    assert (doc["passed"], doc["complete"], doc["reason"]) == (False, False, "interrupted by SIGINT (Ctrl-C)"), doc


SIGNAL_AT_THE_END = """\
import os, signal, time

import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    os.kill(os.getpid(), signal.{name})
    time.sleep(0.3)   # handled here: in the middle of the session's end, its reports being written
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_session_writes_its_reports_is_said_and_the_finished_run_stands(tmp_path, workdir, name):
    """Raised there, it cut the report short: a run that had passed every item read as a crash (about one SIGTERM
    in fifteen sent at a random time to a CPU run; found 2026-12-06)."""
    workdir()
    (tmp_path / "conftest.py").write_text(SIGNAL_AT_THE_END.format(name=name))
    ended = run_group(tmp_path, "wd/model_new.py", "-m", "correctness", "--cudaopt-report=r.json",
                      "--junitxml=j.xml")
    assert ended.ret == 0, ended.stdout + ended.stderr
    doc = ended.report()
    assert (doc["passed"], doc["complete"], doc["cause"]) == (True, True, None), doc
    shown = "SIGTERM" if name == "SIGTERM" else "SIGINT (Ctrl-C)"
    assert f"cudaopt: {shown} while the run writes its reports: they are written, then it ends" in ended.stderr
    assert "Traceback" not in ended.stderr and "from the sentinel" not in ended.stderr
    assert {outcome for outcome, _ in ended.cases().values()} == {"passed"}


def test_a_lost_interrupt_is_raised_again_until_pytest_catches_one(monkeypatch):
    from pytest_cudaopt.run import signals

    monkeypatch.setattr(signals, "received", [])
    monkeypatch.setattr(signals, "_caught", [0])
    signals.raise_lost()                      # none came
    signals.received.append("SIGINT (Ctrl-C)")
    for _ in range(2):                        # lost again: raised again
        with pytest.raises(KeyboardInterrupt):
            signals.raise_lost()
    signals.caught()
    signals.raise_lost()                      # pytest has it
    signals.received.append("SIGTERM")
    with pytest.raises(signals.Terminated):
        signals.raise_lost()


# -- timeouts from the first line --------------------------------------------------------------

@pytest.mark.parametrize("file", ["model.py", "model_new.py"])
def test_a_hang_while_importing_the_workdir_ends_as_a_timeout_with_every_file_written(tmp_path, workdir, file):
    path = workdir()
    source = (path / file).read_text()
    (path / file).write_text(source.replace("\nimport torch\n", "\nimport time\nimport torch\ntime.sleep(10**6)\n", 1))
    started = time.monotonic()
    ended = run_group(tmp_path, "wd/model_new.py", "-m", "correctness", "--cudaopt-timeout=5",
                      "--cudaopt-report=r.json", "--junitxml=j.xml", timeout=120)
    assert ended.ret == 1 and time.monotonic() - started < 90, ended.stdout + ended.stderr
    outcome, text = ended.cases()[("wd", "test_canonical[seed0]")]
    assert outcome == "error"  # at setup: "failed on setup with ..."
    assert f"TIMEOUT: {CANONICAL} ran longer than cudaopt_timeout=5s while loading the workdir" in text
    assert f"where it was:\n  {file}:" in text and "in <module>: time.sleep(10**6)" in text
    doc = ended.report()
    assert doc["passed"] is False and doc["complete"] is True
    assert doc["not_passed"][0].startswith(f"{CANONICAL}: failed: TIMEOUT: ")
    assert "3 items, not run: " in doc["not_passed"][1]
    assert "= cudaopt summary =" in ended.stdout and "FAIL (timeout)" in ended.stdout


def test_a_hung_get_inputs_ends_as_a_timeout_of_its_case(tmp_path, workdir):
    path = workdir()
    model = (path / "model.py").read_text()
    (path / "model.py").write_text(model.replace("def get_inputs():\n",
                                                 "def get_inputs():\n    import time; time.sleep(10**6)\n"))
    ended = run_group(tmp_path, "wd/model_new.py", "-m", "correctness", "--cudaopt-timeout=5",
                      "--cudaopt-report=r.json", "--junitxml=j.xml", "-k", "seed0", timeout=120)
    assert ended.ret == 1
    outcome, text = ended.cases()[("wd", "test_canonical[seed0]")]
    assert outcome == "failed" and "on case canonical inputs of get_inputs()" in text
    assert "model.py:" in text and "in get_inputs: import time; time.sleep(10**6)" in text
    assert ended.report()["passed"] is False


def test_a_hung_build_ends_as_a_timeout_and_stops_the_compiler(tmp_path, workdir):
    workdir()
    compiler = tmp_path / "hung-c++"
    compiler.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'compiler.pid'}\nexec sleep 600\n")
    compiler.chmod(0o755)
    ended = run_group(tmp_path, "wd/model_new.py", "-m", "correctness", "--cudaopt-timeout=5",
                      "--cudaopt-report=r.json", "--junitxml=j.xml", env={"CXX": str(compiler)}, timeout=120)
    assert ended.ret == 1, ended.stdout + ended.stderr
    outcome, text = ended.cases()[("wd", "test_canonical[seed0]")]
    assert outcome == "error" and "while loading the workdir (building its extension" in text
    pid = int((tmp_path / "compiler.pid").read_text())
    assert _ends_within(pid, 15.0), f"the compiler (pid {pid}, sleep 600) outlived the build"  # stopped with ninja
    assert ended.report()["passed"] is False


def _ends_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` is gone (or a zombie: it ran its last instruction) within `seconds`;
    a signal sent as pytest ended may still be on its way on a loaded machine."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# -- a crash names its case ------------------------------------------------------------------

def test_a_crash_on_a_drawn_shape_names_the_shape_and_the_replay_command(tmp_path, workdir):
    """The crash is the worker's: the item fails with the case that killed it (never shrunk past
    it), the session goes on with a fresh worker and ends with every file written."""
    workdir("if x.shape[-1] == 65:\n            ctypes.string_at(0)")
    ended = run_group(tmp_path, "wd/model_new.py", "-m", "correctness", "--cudaopt-report=r.json",
                      "--junitxml=j.xml", timeout=300)
    assert ended.ret == 1, ended.stdout + ended.stderr
    outcome, text = ended.cases()[("wd", "test_drawn_shapes")]
    assert outcome == "failed" and "CRASH: the candidate's worker process was killed by signal SIGSEGV" in text, text
    assert "(case: drawn shape batch_size=16,features=65 " in text
    assert "\nreplay: pytest wd/model_new.py::TestCorrectness::test_drawn_shapes --cudaopt-seed=" in text
    assert "--cudaopt-case=batch_size=16,features=65" in text
    doc = ended.report()
    assert (doc["passed"], doc["complete"]) == (False, True)
    [drawn] = [item for item in doc["items"] if item["test"].endswith("test_drawn_shapes")]
    assert drawn["status"] == "failed" and "--cudaopt-case=batch_size=16,features=65" in drawn["reason"]
    assert [item["status"] for item in doc["items"] if item is not drawn] == ["passed"] * 3


# -- a build folder that cannot be written ---------------------------------------------------

def test_a_read_only_build_folder_is_one_line_naming_cudaopt_build_dir(tmp_path, prebuilt_workdir, monkeypatch):
    from filelock import FileLock

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", self.lock_file)

    monkeypatch.setattr(FileLock, "acquire", read_only)
    with pytest.raises(build.BuildError) as info:
        build.build(prebuilt_workdir("cpu_scale"))
    text = info.value.report()
    assert len(text.splitlines()) == 1 and "Traceback" not in text
    assert "cannot be written (Read-only file system: " in text and "/lock)" in text
    assert "a read-only workdir builds elsewhere with cudaopt_build_dir (--cudaopt-build-dir=" in text


def test_an_unwritable_build_folder_fails_its_first_item_once_and_the_others_refer_to_it(pytester, make_workdir):
    path = make_workdir("cpu_scale", dest=pytester.path / "wd")
    pytester.makeini(CPU_INI)
    [build_dir] = (path / "build" / "cudaopt").iterdir()
    (build_dir / "lock").unlink(missing_ok=True)
    (build_dir / "lock").mkdir()  # a lock file that cannot be opened, as on a read-only mount
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--cudaopt-report=r.json")
    result.assert_outcomes(errors=4)
    text = result.stdout.str().split("short test summary info")[0].split("= cudaopt summary =")[0]
    assert text.count(f"cudaopt build: the build folder {build_dir} cannot be written (Is a directory: ") == 1
    assert text.count(f"not run: the build failed; the report is under {CANONICAL}") == 3
    assert "Traceback" not in text and "IsADirectoryError" not in text
    assert json.loads((pytester.path / "r.json").read_text())["passed"] is False


def test_a_sigterm_to_a_pytest_xdist_group_leaves_every_item_in_the_junit_file(tmp_path, workdir):
    workdir(STARTED)
    ended = run_group(tmp_path, "-p", "xdist", "-n", "2", "wd/model_new.py", "-m", "correctness",
                      "--cudaopt-report=r.json", "--junitxml=j.xml", signal_when=_started(tmp_path),
                      signum=signal.SIGTERM)
    assert ended.ret == 2, ended.stdout + ended.stderr
    doc = ended.report()
    assert (doc["passed"], doc["complete"], doc["cause"], doc["blame"]) == (False, False, "interrupted", None)
    statuses = sorted(item["status"] for item in doc["items"])
    assert len(statuses) == 4 and set(statuses) <= {"failed", "not run"} and "failed" in statuses
    cases = ended.cases()
    assert len(cases) == 4  # one test case per item: the workers' and the controller's reports agree
    for outcome, text in cases.values():
        assert (outcome, text.split("\n")[0]) in (("failed", "INTERRUPTED: interrupted by SIGTERM while this test ran"),
                                                   ("skipped", "not run: the run was interrupted by SIGTERM before it"))


# A process that prints its "stacks" on SIGUSR1 as a descheduled worker would: the header,
# a pause of many scheduler slices (shorter than client.STACK_QUIET_S), then the frames.
SLOW_DUMP = r'''
import os, signal, sys, time
log = open(sys.argv[1], "a")
def dump(*_):
    log.write("Current thread 0x1 (most recent call first):\n"); log.flush()
    time.sleep(0.15)
    log.write('  File "/wd/model_new.py", line 19 in forward\n'); log.flush()
signal.signal(signal.SIGUSR1, dump)
print("ready", flush=True)
while True:
    time.sleep(1)
'''


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_a_hung_workers_stacks_are_read_whole_though_it_prints_them_slowly(tmp_path):
    from pytest_cudaopt.remote.worker import Worker

    log = tmp_path / "worker.log"
    log.write_text("")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_DUMP, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        worker = Worker(tmp_path, None)
        worker.proc, worker.log_path = proc, log
        stacks = worker.stacks()
    finally:
        proc.kill()
        proc.wait()
    assert "Current thread" in stacks and 'model_new.py", line 19 in forward' in stacks, stacks


def test_while_the_reports_are_written_a_second_ctrl_c_interrupts_at_once(monkeypatch):
    """An end that hangs (a worker that will not die) must still yield to Ctrl-C pressed twice."""
    from pytest_cudaopt.run import signals

    monkeypatch.setattr(signals, "_finishing", [True])
    monkeypatch.setattr(signals, "_finish_seen", set())
    signals._handler(signal.SIGINT, None)          # said, ignored
    signals._handler(signal.SIGTERM, None)
    signals._handler(signal.SIGTERM, None)         # SIGTERM again: still ignored (SIGKILL ends it)
    with pytest.raises(KeyboardInterrupt):
        signals._handler(signal.SIGINT, None)
