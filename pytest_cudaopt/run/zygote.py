"""A process that has imported torch once and forks, on request, a worker (the candidate's process) or a judging child (`python -m MODULE ARGS`: a judge stage's pytest or build): each starts in a tenth of a second instead of a torch import (seconds of CPU on a small machine).

The zygote kills a fork's process group when its requester's connection closes, so a fork never
outlives its requester. It runs no candidate code: a worker fork never returns into its loop.
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
# What the forks import. Not torch.utils.cpp_extension: its import may ask CUDA for its devices,
# after which torch calls every fork a bad one. Nothing of pytest_cudaopt's: a judging child
# imports the plugin as a fresh `python -m pytest` would, reading its own environment.
PRELOAD = ("torch", "torch.multiprocessing", "torch._dynamo", "torch._inductor", "torch._inductor.config",
           "numpy", "pytest", "filelock")
# What the forks import afresh, compiled into a bytecode folder of the judge's (PYTHONPYCACHEPREFIX) with PRELOAD.
COMPILED = ("pytest_cudaopt", "_pytest", "pluggy", "hypothesis")


def _address(name: str) -> str:
    return "\0" + name  # an abstract socket: no file to leave behind or for anyone to find on disk


class Forked:
    """A worker forked by a zygote, as much of subprocess.Popen as the client uses."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None
        self._buffer = b""

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        try:
            ready, _, _ = select.select([self.conn], [], [], timeout)
            chunk = self.conn.recv(4096) if ready else None
        except (OSError, ValueError):  # closed by another thread meanwhile (`close`): the fork is ended
            chunk = b""
        if chunk is None:
            return
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
        if self.returncode is None:  # the zygote kills a fork once its requester's connection closes
            self.returncode = -signal.SIGKILL
        self.conn.close()


def spawn(channel: int, log: int, cwd: str, env: dict[str, str]) -> Forked | None:
    """A worker forked by the zygote `CUDAOPT_WORKER_ZYGOTE` names; None when none answers."""
    return _ask(os.environ.get(ENV), {"kind": "worker", "cwd": cwd, "env": env}, [channel, log])


def spawn_module(name: str | None, module: str, args: list[str], *, cwd: str, env: dict[str, str], log: int,
                 nice: int = 0) -> Forked | None:
    """`python -m MODULE ARGS`, forked by the zygote at `name`; None when none answers."""
    return _ask(name, {"kind": "module", "module": module, "args": [str(a) for a in args], "cwd": cwd,
                       "env": env, "nice": int(nice)}, [log])


def _ask(name: str | None, request: dict, fds: list[int]) -> Forked | None:
    if not name:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(_address(name))
        data = json.dumps({**request, "root": package_root()}).encode() + b"\n"
        socket.send_fds(conn, [data], fds)
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the zygote closed the connection")
            line += chunk
        reply = json.loads(line)
        conn.settimeout(None)
        return Forked(conn, int(reply["pid"]))
    except (OSError, ValueError, KeyError):
        conn.close()
        return None


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """In a child (a preexec_fn): `signum` when its parent dies, even by SIGKILL (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signum)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def package_root() -> str:
    import pytest_cudaopt

    return os.path.dirname(os.path.dirname(os.path.realpath(pytest_cudaopt.__file__)))


def start(name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A zygote listening at `name` when this returns, ending when its stdin is closed. It starts in this
    package's root: `python -m` imports from its folder first, and a zygote of another package serves no fork."""
    proc = subprocess.Popen([sys.executable, "-m", "pytest_cudaopt.run.zygote", name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, start_new_session=True, cwd=package_root(),
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
    _preload()
    root = package_root()
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


def _preload() -> None:
    """Import PRELOAD, asking NVML rather than CUDA where torch asks for devices (a fork then takes
    CUDA's view of its devices from its environment), then freeze what the imports made: a fork's
    garbage collections never walk it, and its pages stay shared."""
    import gc
    import importlib

    asked = "PYTORCH_NVML_BASED_CUDA_CHECK" in os.environ
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a fork imports it again and reports it in its own words
                pass
    finally:
        if not asked:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
    _compile_for_forks()
    gc.collect()
    gc.freeze()


def _compile_for_forks() -> None:
    """With a bytecode folder (PYTHONPYCACHEPREFIX) it may write, the zygote writes it alone: PRELOAD's bytecode
    as it imports, then COMPILED's. Its forks and the fresh Pythons the judge's children start read it and write
    none (PYTHONDONTWRITEBYTECODE): nothing that runs the candidate's code writes what another process loads."""
    if not sys.pycache_prefix or sys.dont_write_bytecode:
        return
    import compileall
    import importlib.util

    for name in COMPILED:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            compileall.compile_dir(folder, quiet=2, workers=1)


def _cuda_poisoned() -> bool:
    """Whether torch calls this fork a bad one: something before the fork touched CUDA."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and getattr(torch.cuda, "_is_in_bad_fork", lambda: False)())


def sees_given_devices(visible: str) -> bool:
    """Whether CUDA, asked now, sees the devices given (False: it took its view of them before)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda._is_compiled():
        return True
    if torch.cuda.is_initialized():
        return False
    if not visible or torch._C._cuda_getDeviceCount() > 0:
        return True
    # CUDA sees none: stale if NVML (which reads CUDA_VISIBLE_DEVICES at each call and
    # initialises no CUDA) sees one; -1 (no NVML) or 0: there is none to see.
    nvml = getattr(torch.cuda, "_device_count_nvml", lambda: -1)()
    return nvml <= 0


def _kill(pid: int) -> None:
    for target in (os.killpg, os.kill):
        try:
            target(pid, signal.SIGKILL)
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
    kind = request.get("kind", "worker")
    if len(fds) != {"worker": 2, "module": 1}.get(kind) or request.get("root") != root:  # not ours to serve
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
            if kind == "worker":
                _become_worker(request, fds, base_path)
            else:
                _become_module(request, fds[0], base_path)
        finally:
            os._exit(70)  # each exits itself; nothing of the zygote's may run after
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _become(request: dict, log: int, base_path: list[str]) -> None:
    """What a fresh `python -m ...` in the request's folder and environment would be."""
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
    # tempfile keeps the folder it chose first: the zygote's, which a sandboxed worker may not write.
    import tempfile

    tempfile.tempdir = None
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *[p for p in base_path if p not in extra]]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.pycache_prefix = os.environ.get("PYTHONPYCACHEPREFIX") or None
    import importlib

    importlib.invalidate_caches()
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)


def _forget_package() -> None:
    """The zygote's own modules go: the child imports pytest_cudaopt afresh, as `python -m` would
    (pytest rewrites a plugin's package on import and warns of one imported before it)."""
    for loaded in [m for m in sys.modules if m == "pytest_cudaopt" or m.startswith("pytest_cudaopt.")]:
        del sys.modules[loaded]


def _become_module(request: dict, log: int, base_path: list[str]) -> None:
    """`python -m MODULE ARGS`: its exit handlers run, the teardown of the preloaded modules does not."""
    import atexit
    import runpy

    _become(request, log, base_path)
    if request.get("nice"):
        os.nice(int(request["nice"]))
    die_with_parent(signal.SIGKILL)  # the zygote also kills it when its requester goes
    argv = [sys.executable, "-m", str(request["module"]), *request["args"]]
    if _cuda_poisoned() or not sees_given_devices(os.environ.get("CUDA_VISIBLE_DEVICES", "")):
        os.execv(sys.executable, argv)  # CUDA was touched, or took its view of the devices, before the fork
    _forget_package()

    def run() -> int:
        sys.argv = [str(request["module"]), *request["args"]]
        runpy.run_module(str(request["module"]), run_name="__main__", alter_sys=True)
        return 0

    _exit_with(run, lambda code: 0 if code is None else 1, atexit._run_exitfuncs)


def _exit_with(run, non_int_exit, at_exit=lambda: None) -> None:
    """Exit with `run()`'s status as an executed interpreter would (`non_int_exit`: a SystemExit's non-int code)."""
    code = 1
    try:
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else non_int_exit(exc.code)
    except BaseException:  # noqa: BLE001 - as an executed interpreter would: the traceback, status 1
        import traceback

        traceback.print_exc()
    finally:
        at_exit()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _become_worker(request: dict, fds: list[int], base_path: list[str]) -> None:
    channel, log = fds
    _become(request, log, base_path)
    sys.dont_write_bytecode = True
    die_with_parent(signal.SIGKILL)  # the zygote also kills it when its judging process goes
    if _cuda_poisoned():  # a fork cannot use CUDA here: the worker as `python -m pytest_cudaopt.candidate FD`
        os.set_inheritable(channel, True)
        os.execv(sys.executable, [sys.executable, "-m", "pytest_cudaopt.candidate", str(channel)])
    _forget_package()
    from pytest_cudaopt.candidate.serve import main

    _exit_with(lambda: main([str(channel)]), lambda code: 1)


if __name__ == "__main__":  # run through the imported module, whose globals the forked children share
    from pytest_cudaopt.run import zygote

    sys.exit(zygote.serve(sys.argv[1]))
