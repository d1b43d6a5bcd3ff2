"""One child process: forked from the pool's zygote (or executed), in a session of its own, logged to a file, ended with its whole group at its time limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from pytest_cudaopt.run import zygote

GRACE_S = 10.0   # after SIGTERM at the time limit (the plugin writes its reports), then SIGKILL


@dataclass
class Outcome:
    """How a child ended (`returncode` negative: the signal that ended it)."""

    returncode: int
    timed_out: bool
    seconds: float
    tail: str
    log: Path

    @property
    def signal(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"


class Children:
    """The running children, ended by their groups; `parent`: a wider set each joins too (the pool's)."""

    def __init__(self, parent: "Children | None" = None) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self.stopping = False
        self.parent = parent

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.add(proc)
            if self.stopping:
                _end_group(proc.pid, signal.SIGTERM)
        if self.parent is not None:
            self.parent.add(proc)

    def remove(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs.discard(proc)
        if self.parent is not None:
            self.parent.remove(proc)

    def stop_all(self) -> None:
        with self._lock:
            self.stopping = True
            procs = list(self._procs)
        for proc in procs:
            _end_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _end_group(proc.pid, signal.SIGKILL)


def _end_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_group(pgid: int, wait_s: float = 5.0) -> None:
    """What the child left in its group (the plugin's sentinel writes the JUnit file after a crash) gets `wait_s`."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    _end_group(pgid, signal.SIGKILL)


_UNFORKED: set[str] = set()   # the zygotes that forked no child asked of them (said once each)


def _die_with_judge(nice: int = 0) -> None:
    """In the child, before exec: SIGTERM when the thread that started it (the judge) dies."""
    from pytest_cudaopt.run.zygote import die_with_parent

    if nice:
        os.nice(nice)
    die_with_parent(signal.SIGTERM)


def _spawn(command: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path, nice: int = 0,
           zygote_name: str | None = None) -> "subprocess.Popen | zygote.Forked":
    """`command` (`python -m MODULE ARGS`) forked by the zygote `zygote_name` where there is one, else executed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        if zygote_name and len(command) >= 3 and command[1] == "-m":
            forked = zygote.spawn_module(zygote_name, command[2], list(command[3:]), cwd=str(cwd), env=dict(env),
                                         log=out.fileno(), nice=nice)
            if forked is not None:
                return forked
            if zygote_name not in _UNFORKED:   # said once: every child then pays a fresh interpreter's imports
                _UNFORKED.add(zygote_name)
                print(f"cudaopt judge: the zygote {zygote_name} forked no child (gone, or serving another copy of "
                      f"pytest_cudaopt than {zygote.package_root()}); children start as fresh Pythons, slower",
                      file=sys.stderr)
        return subprocess.Popen(list(command), env=dict(env), cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: _die_with_judge(nice))


def run(command: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float, log: Path,
        children: Children | None = None, grace: float = GRACE_S, nice: int = 0,
        zygote_name: str | None = None, paused: Callable[[], float] = lambda: 0.0) -> Outcome:
    """Run `command` to its end or its time limit (SIGTERM to its group, SIGKILL after `grace`), output to `log`.
    `paused()`: seconds the child waited on the judge (its turn), added to the limit."""
    start = time.monotonic()
    proc = _spawn(command, env, cwd, log, nice, zygote_name)
    if children is not None:
        children.add(proc)
    timed_out = False
    try:
        while not timed_out:
            try:
                proc.wait(timeout=max(0.0, start + timeout + paused() - time.monotonic()))
                break
            except subprocess.TimeoutExpired:
                timed_out = time.monotonic() >= start + timeout + paused()
        if timed_out:
            _end_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _end_group(proc.pid, signal.SIGKILL)
                proc.wait()
        _reap_group(proc.pid)
    finally:
        if children is not None:
            children.remove(proc)
        if isinstance(proc, zygote.Forked):
            proc.close()
    return Outcome(proc.returncode, timed_out, time.monotonic() - start, tail(log), log)


def tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
