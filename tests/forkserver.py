"""`python -m pytest` in a fork of a process that has imported torch and Hypothesis already: the self-tests' pytest runs, each without paying those imports again.

The plugin's end-to-end tests start a fresh `pytest` per case (a subprocess is what they test:
the plugin's hooks, its reports, its exit code). Most of such a child's CPU time on a small
machine is spent importing torch, torch._dynamo, torch._inductor and Hypothesis, which no test
looks at. The server (`python tests/forkserver.py`, one per test process, started on first use)
imports them once, then forks a child per request. The child becomes what `python -m pytest` in
that folder with that environment would be: its own working directory, environment, sys.path
(the folder first, then PYTHONPATH), arguments, standard streams on the given files and stdin at
end of file, then `pytest.main()`, its exit handlers and its exit status (the interpreter's
teardown of the preloaded modules is skipped: nothing of the run's is left to it). Nothing of
pytest_cudaopt is imported before the fork, so the plugin loads in the child as in a fresh
process (it reads the environment it was started with at load).

A request may instead name any Python command line (`run_python` in support.py: `-m MODULE ...`,
`-c CODE ...` or `SCRIPT ...`): the child becomes that program the same way (runpy), for the
tests that start the plugin's CLI, `utils/` or a benchmark script.

The server answers each request with the child's pid, then with its exit status as
subprocess.Popen gives it (a negative number for a signal). It ends when its standard input
closes (the test process ended). `CUDAOPT_TEST_FORK=0` turns it off: every run is a plain
subprocess.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

# Imported before the fork: what every pytest child of the self-tests imports and none looks at.
# Not torch.utils.cpp_extension: its import asks CUDA for devices (even where there is no
# driver), after which torch calls every fork bad and each child would exec a fresh Python.
PRELOAD = ("torch", "torch._dynamo", "torch._inductor", "torch._inductor.config", "hypothesis", "numpy", "pytest",
           "filelock")


def enabled() -> bool:
    return os.environ.get("CUDAOPT_TEST_FORK", "1") != "0"


class Server:
    """The client's side: one server process, one request at a time."""

    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True, bufsize=1)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, args: list[str], *, cwd: Path, env: dict[str, str], stdout: Path, stderr: Path,
            timeout: float | None, python: bool = False) -> int | None:
        """The exit status of `python -m pytest *args` (with `python`, of `python *args`) run in
        `cwd` with `env`; None when it ran longer than `timeout` (it is then killed, as
        subprocess.run would)."""
        pid = self.start(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, python=python)
        status = self.wait(timeout)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            self.wait(None)   # the server's reply for the killed child
        return status

    def start(self, args: list[str], *, cwd: Path, env: dict[str, str], stdout: Path, stderr: Path,
              python: bool = False, new_session: bool = False) -> int:
        """Start the child (`new_session`: in a session and process group of its own, as
        subprocess.Popen(start_new_session=True)); its pid. `wait` gives its status."""
        request = {"args": [str(a) for a in args], "cwd": str(cwd), "env": env, "python": python,
                   "new_session": new_session, "stdout": str(stdout), "stderr": str(stderr)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        return json.loads(self._line(None))["pid"]

    def wait(self, timeout: float | None) -> int | None:
        """The started child's exit status; None if it is still running after `timeout` seconds."""
        try:
            return json.loads(self._line(timeout))["status"]
        except TimeoutError:
            return None

    def _line(self, timeout: float | None) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the pytest fork server (pid {self.proc.pid}) ended: exit {self.proc.wait()}")
        return line


# ------------------------------------------------------------------------------------- server

def _serve() -> None:
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    base_path = [p for p in sys.path[1:] if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    # What the imports made is never garbage: frozen, no collection of a child walks it again (a
    # gen-2 collection over torch's objects took 0.18 s, and pytest runs two at its end).
    gc.collect()
    gc.freeze()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            if request.get("new_session"):
                os.setsid()
            if request.get("python") and request["args"][:2] == ["-m", "pytest"]:
                request = {**request, "args": request["args"][2:]}
            elif request.get("python"):
                _become_python(request, base_path)   # never returns
            _become_pytest(request, base_path)   # never returns: the child exits through SystemExit
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")


def _enter(request: dict, base_path: list[str], argv: list[str], path0: str | None = None) -> None:
    """The child takes the request's folder, environment, streams and Python's signal handlers,
    and the sys.path `python *argv` would have there (`path0` first, default the folder)."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    __import__("tempfile").tempdir = None   # chosen afresh from the child's TMPDIR
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda._is_in_bad_fork():
        # Something the server imported initialised CUDA (on a GPU host), which a fork cannot
        # use: this child becomes a fresh `python *argv` instead, on the same streams.
        os.execv(sys.executable, [sys.executable, *argv])
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd() if path0 is None else path0, *extra, *[p for p in base_path if p not in extra]]
    import importlib

    importlib.invalidate_caches()


def _become_pytest(request: dict, base_path: list[str]) -> None:
    try:
        _enter(request, base_path, ["-m", "pytest", *request["args"]])
        import _pytest.assertion.rewrite
        import pytest

        # pytest rewrites the asserts of a plugin's modules when it imports them, and warns of
        # those imported before it (Hypothesis, preloaded): nothing of theirs is asserted on here.
        _pytest.assertion.rewrite.AssertionRewritingHook._warn_already_imported = lambda self, name: None
        sys.argv = [str(Path(pytest.__file__).with_name("__main__.py")), *request["args"]]
        code = int(pytest.main())   # what `python -m pytest` does, less its deprecated console_main
        # Then the exit handlers, and not the interpreter's teardown of torch's modules (0.3 s).
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException as exc:  # noqa: BLE001 - whatever ends the child becomes its exit status
        if isinstance(exc, SystemExit):
            raise
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(70)


def _become_python(request: dict, base_path: list[str]) -> None:
    """The child becomes `python *request["args"]` (-m MODULE, -c CODE or a script), then exits
    with its status."""
    code = 70
    try:
        args = request["args"]
        # sys.path[0] as `python` sets it: the folder for -m, "" for -c, the script's folder
        script = str(Path(request["cwd"], args[0]).resolve().parent)
        path0 = None if args[0] == "-m" else "" if args[0] == "-c" else script
        _enter(request, base_path, args, path0)
        import runpy

        try:
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            elif args[0] == "-c":
                sys.argv = ["-c", *args[2:]]
                exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv = list(args)
                runpy.run_path(args[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - what `python` prints for an uncaught exception, status 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _serve()
