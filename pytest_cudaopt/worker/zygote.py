"""A process that has imported torch and forks workers on request: a worker that starts in a tenth of a second instead of a torch import (about 3 s of CPU on a small machine).

`python -m pytest_cudaopt.worker zygote ADDRESS` listens on the abstract unix socket ADDRESS,
imports what every worker imports (torch, the worker's own modules; nothing of a workdir's) and
serves until its standard input closes. A judging process that finds ADDRESS in
`CUDAOPT_WORKER_ZYGOTE` asks it for a worker (`spawn`) instead of executing a fresh Python: it
sends the worker's end of the socket pair and its log file as file descriptors, with the working
directory and environment the worker would have been started with. The fork becomes what
`python -m pytest_cudaopt.worker FD` in that folder with that environment would be (a session
of its own, stdin at end of file, stdout and stderr on the log), then runs the same
`server.main`. The zygote answers with the fork's pid, later with its exit status, and kills
the fork's process group when the judging process's connection closes: a worker never outlives
the process that asked for it, as one started with PR_SET_PDEATHSIG does not.

The plugin's own test suite starts one per test process (hundreds of pytest sessions, each with
a worker); a user's `pytest` starts its worker the plain way. The zygote runs no candidate
code: each fork is the only process that does, and it never returns into the zygote's loop.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

ENV = "CUDAOPT_WORKER_ZYGOTE"
CONNECT_TIMEOUT_S = 120.0  # the zygote accepts once its imports are done


def _address(name: str) -> str:
    return "\0" + name  # an abstract socket: no file to leave behind or for anyone to find on disk


# ------------------------------------------------------------------------------- the judging side

class Forked:
    """A worker forked by a zygote, as much of subprocess.Popen as the client uses: `pid`,
    `poll()`, `wait(timeout)`, `kill()`, `returncode`."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None
        self._buffer = b""

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self.conn], [], [], timeout)
        if not ready:
            return
        chunk = self.conn.recv(4096)
        if not chunk:  # the zygote is gone, and with it (it kills them) the worker
            self.returncode = -signal.SIGKILL
            return
        self._buffer += chunk
        if b"\n" in self._buffer:
            self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["status"])

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("cudaopt worker", timeout)
            self._read(left)
        return self.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def close(self) -> None:
        self.conn.close()


def spawn(channel: int, log: int, cwd: str, env: dict[str, str]) -> Forked | None:
    """A worker forked by the zygote `CUDAOPT_WORKER_ZYGOTE` names, serving on the inherited
    socket `channel`; None when there is none or it does not answer (the caller starts one the
    plain way: the zygote is a shortcut, never a requirement)."""
    name = os.environ.get(ENV)
    if not name:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(_address(name))
        request = json.dumps({"cwd": cwd, "env": env, "root": _package_root()}).encode() + b"\n"
        socket.send_fds(conn, [request], [channel, log])
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the zygote closed the connection")
            line += chunk
        reply = json.loads(line)
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return None
    if "pid" not in reply:
        conn.close()
        return None
    return Forked(conn, int(reply["pid"]))


def _package_root() -> str:
    import pytest_cudaopt

    return os.path.dirname(os.path.dirname(os.path.realpath(pytest_cudaopt.__file__)))


# ---------------------------------------------------------------------------------- the zygote

def start(name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A zygote listening at `name` when this returns, ending when the returned process's
    stdin is closed (or the caller dies: its stdin is a pipe from the caller)."""
    from pytest_cudaopt.signals import die_with_parent

    proc = subprocess.Popen([sys.executable, "-m", "pytest_cudaopt.worker", "zygote", name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, start_new_session=True,
                            preexec_fn=lambda: die_with_parent(signal.SIGKILL))
    proc.stdout.readline()  # bound: a worker asked for from now on waits for it (its imports) rather than missing it
    proc.stdout.close()
    return proc


def serve(name: str) -> int:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(_address(name))
    listener.listen(64)
    os.write(1, b"listening\n")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    import torch  # noqa: F401 - what each worker would import: done once, here
    import torch.multiprocessing  # noqa: F401

    import pytest_cudaopt.worker.server  # noqa: F401
    import pytest_cudaopt.workdir  # noqa: F401

    root = _package_root()
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    forks: dict[int, socket.socket] = {}   # pid -> the connection of the judging process that asked
    killed: set[int] = set()
    while True:
        watched = [conn for pid, conn in forks.items() if pid not in killed]
        ready, _, _ = select.select([sys.stdin, listener, *watched], [], [], 0.1)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1024):
            break  # whoever started the zygote is gone
        if listener in ready:
            conn, _ = listener.accept()
            pid = _fork(conn, root, base_path, listener, forks)
            if pid is not None:
                forks[pid] = conn
        for pid, conn in list(forks.items()):
            if conn in ready:
                try:
                    gone = not conn.recv(1, socket.MSG_PEEK)
                except OSError:
                    gone = True
                if gone:  # the judging process closed its end or died: so does its worker
                    _kill(pid)
                    killed.add(pid)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = forks.pop(pid, None)
            killed.discard(pid)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()
    for pid in forks:
        _kill(pid)
    return 0


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except OSError:
            pass


def _fork(conn: socket.socket, root: str, base_path: list[str], listener: socket.socket,
          forks: dict[int, socket.socket]) -> int | None:
    try:
        conn.settimeout(10)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
        request: dict[str, Any] = json.loads(data)
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return None
    if len(fds) != 2 or request.get("root") != root:  # another checkout of the package: not ours to serve
        for fd in fds:
            os.close(fd)
        conn.sendall(b'{"error": "not this zygote\'s package"}\n')
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            conn.close()
            for other in forks.values():
                other.close()
            _become_worker(request, fds, base_path)
        finally:
            os._exit(70)  # _become_worker exits itself; nothing of the zygote's may run after
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _become_worker(request: dict, fds: list[int], base_path: list[str]) -> None:
    channel, log = fds
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                      else signal.SIG_IGN if sig == signal.SIGPIPE else signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *[p for p in base_path if p not in extra]]
    sys.dont_write_bytecode = True
    import importlib

    importlib.invalidate_caches()
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    from pytest_cudaopt.signals import die_with_parent
    from pytest_cudaopt.worker.server import main

    die_with_parent(signal.SIGKILL)  # the zygote also kills it when its judging process goes
    code = 1
    try:
        code = main([str(channel)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - as an executed interpreter would: the traceback, status 1
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

