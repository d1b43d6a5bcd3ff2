"""A warm judge for a loop that asks again and again: workdirs submitted as they come (a folder, a tar file, tar bytes), a Future of each one's line; one pool (its zygote, caches and learned memory needs) kept across them; a backstop per workdir; `close` drains, `stop` cancels."""

from __future__ import annotations

import itertools
import shutil
import tarfile
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pytest_cudaopt.judge import copies, lines
from pytest_cudaopt.judge.devices import DeviceSet
from pytest_cudaopt.judge.discover import is_workdir
from pytest_cudaopt.judge.options import Options, result_key
from pytest_cudaopt.judge.pool import LocalPool
from pytest_cudaopt.run.scratch import own_folder

OPEN, CLOSED, STOPPED = "open", "closed", "stopped"


@dataclass
class _Pending:
    """A submission without its line yet."""

    future: Future
    name: str
    submitted: float
    folder: Path | None = None    # where its bytes were unpacked (removed with its line)
    began: float | None = None    # when its first stage started
    path: Path | None = None      # what the pool copies (judged again while the environment is blamed)


class Service:
    """Judges workdirs as they are submitted, on this host's devices, until `close` or `stop`; a context manager.
    `devices` and `run_stage`: tests."""

    def __init__(self, options: Options | None = None, *, devices: DeviceSet | None = None,
                 run_stage: Callable[..., Any] | None = None, on_event: Callable[..., None] | None = None):
        self.options = options or Options()
        self._pool = LocalPool([], self.options, devices, fed=True, run_stage=run_stage, on_event=self._event)
        if not self._pool.devices.names:
            raise ValueError("no device to judge on: no GPU is visible; for CPU workdirs put --cudaopt-device=cpu "
                             "in the pytest arguments (Options.pytest_args, or after `--`)")
        self._on_event = on_event
        self._wake = threading.Condition()
        self._pending: dict[Any, _Pending] = {}
        self._abandoned: set[Any] = set()   # ids past their backstop whose pool line is still to come
        self._attempts = lines.Attempts(self.options.judge_again)   # each id's lines (judged again: environment)
        self._numbers = itertools.count()
        self._state = OPEN
        self._over = False
        self._failure: str | None = None   # why the judge itself failed, for what is submitted after
        self._shipped = own_folder("serve")
        self._thread = threading.Thread(target=self._run, name="cudaopt-service", daemon=True)
        self._watch = threading.Thread(target=self._watchdog, name="cudaopt-service-backstop", daemon=True)
        self._thread.start()
        self._watch.start()

    def __enter__(self) -> "Service":
        return self

    def __exit__(self, kind, *_) -> None:
        self.stop() if kind is not None else self.close()

    @property
    def devices(self) -> list[str]:
        return list(self._pool.devices.names)

    @property
    def in_flight(self) -> int:
        with self._wake:
            return len(self._pending)

    def submit(self, workdir: str | Path | bytes, *, id: Any = None, name: str | None = None) -> Future:
        """Judge `workdir`: a folder, a tar file of one, or the bytes of a tar; the Future's result is its line.
        `id` (default: the submission's number) must not be one in flight; `name` defaults to the path or `tar:ID`."""
        future: Future = Future()
        future.set_running_or_notify_cancel()   # stop() cancels, not the Future
        submitted = time.monotonic()
        with self._wake:
            if id is None:
                id = next(n for n in self._numbers if n not in self._pending and n not in self._abandoned)
            elif id in self._pending or id in self._abandoned:
                raise ValueError(f"id {id!r} is still in flight: each submission's id must differ from those "
                                 f"without their line")
            name = name or (f"tar:{id}" if isinstance(workdir, (bytes, bytearray, memoryview)) else str(workdir))
            self._pending[id] = pending = _Pending(future, name, submitted)
        try:
            path = self._place(workdir, pending, id)
        except (OSError, ValueError, copies.CopyError, tarfile.TarError) as exc:
            self._resolve(id, self._unjudged(id, pending, "error", f"not judged: {exc}"))
            return future
        pending.path = path
        with self._wake:   # added before close() or stop() tells the pool, or not at all
            state = self._state
            if state == OPEN:
                self._pool.add(path, pending.name, None, id, submitted)
        if state != OPEN and self._failure is not None:
            self._resolve(id, self._unjudged(id, pending, "error", self._failure))
        elif state != OPEN:
            self._resolve(id, self._unjudged(id, pending, "cancelled", f"submitted after the service was {state}"))
        return future

    def _place(self, workdir: str | Path | bytes, pending: _Pending, id: Any) -> Path:
        """The folder the pool copies: the workdir itself, or where its tar was unpacked."""
        if not isinstance(workdir, (bytes, bytearray, memoryview)):
            path = Path(workdir).expanduser()
            if path.is_dir():
                if not is_workdir(path):
                    raise ValueError(f"{workdir} is not a workdir (no model.py and model_new.py)")
                return path.resolve()
            if not path.is_file():
                raise ValueError(f"{workdir}: no such file or folder")
            workdir = path.read_bytes()
        pending.folder = Path(tempfile.mkdtemp(prefix="tar-", dir=self._shipped))
        top = pending.folder / "workdir"
        copies.unpack(bytes(workdir), top)
        inside = [p for p in top.iterdir() if p.is_dir()]
        if not is_workdir(top) and len(inside) == 1 and is_workdir(inside[0]):
            top = inside[0]
        if not is_workdir(top):
            raise ValueError(f"{pending.name}: the tar holds no workdir (model.py and model_new.py) at its top "
                             f"or in its one folder")
        return top

    def close(self, wait: bool = True) -> None:
        """No more submissions: those in flight are judged to their lines (`wait`: until they are)."""
        with self._wake:
            if self._state == OPEN:
                self._state = CLOSED
                self._pool.close()
        if wait:
            self._thread.join()

    def wait(self, timeout: float | None = None) -> bool:
        """After `close` or `stop`: wait up to `timeout` seconds for every line; whether all are out."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """End every running child now; every submission without its line gets a `cancelled` one."""
        with self._wake:
            if self._state != STOPPED:
                self._state = STOPPED
                self._pool.stop("the service was stopped")
        self._thread.join()

    def _run(self) -> None:
        """The pool's lines to their Futures; at its end, any submission still without one gets one."""
        status, why = "cancelled", "the service was stopped before this workdir's judging began"
        try:
            for line in self._pool.lines():
                if not self._again(line):
                    self._resolve(line["id"], line)
        except BaseException as exc:  # noqa: BLE001 - the judge's own failure: every submission still gets its line
            status, why = "error", f"not judged: the judge failed: {type(exc).__name__}: {exc}"
            self._failure = why
        finally:
            with self._wake:
                self._state = STOPPED if self._state == OPEN else self._state
                left = list(self._pending.items())
            for id, pending in left:
                self._resolve(id, self._unjudged(id, pending, status, why))
            with self._wake:
                self._over = True
                self._wake.notify_all()
            shutil.rmtree(self._shipped, ignore_errors=True)

    def _again(self, line: dict) -> bool:
        """Whether a line that blames the environment is judged again (as `cudaopt judge` does)."""
        with self._wake:
            pending = self._pending.get(line["id"])
            if pending is None:
                return False
            if not self._attempts.again(line["id"], line,
                                        allowed=self._state != STOPPED and line["id"] not in self._abandoned):
                return False
            self._pool.add(pending.path, pending.name, None, line["id"], pending.submitted, again=True)
            return True

    def _resolve(self, id: Any, line: dict) -> None:
        """The line of submission `id`, once: a second (an abandoned workdir's own, after its backstop line) is dropped."""
        with self._wake:
            if id in self._abandoned and id not in self._pending:
                self._abandoned.discard(id)
                return
            pending = self._pending.pop(id, None)
        if pending is not None:
            _deliver(pending, line)

    def _unjudged(self, id: Any, pending: _Pending, status: str, why: str) -> dict:
        now = time.monotonic()
        queued = (pending.began if pending.began is not None else now) - pending.submitted
        return lines.unjudged(pending.name, result_key(pending.name, "", self.options), status, why,
                              seconds=now - pending.submitted, id=id, queued=queued)

    def _event(self, kind: str, job, task, *rest) -> None:
        if kind == "start":
            with self._wake:
                pending = self._pending.get(job.id)
                if pending is not None and pending.began is None:
                    pending.began = job.began if job.began is not None else time.monotonic()
                    self._wake.notify_all()
        if self._on_event is not None:
            self._on_event(kind, job, task, *rest)

    def _watchdog(self) -> None:
        """Each workdir past its backstop: a `timeout` line now, its children ended, its own line dropped."""
        limit = self.options.backstop_s
        while True:
            with self._wake:
                if self._over:
                    return
                now = time.monotonic()
                late = [(id, p) for id, p in self._pending.items() if p.began is not None and now - p.began > limit]
                if not late:
                    due = [p.began + limit - now for p in self._pending.values() if p.began is not None]
                    self._wake.wait(timeout=max(0.05, min(due)) if due else None)
                    continue
                for id, _ in late:   # the pool's own line for it, when it comes, is dropped
                    del self._pending[id]
                    self._abandoned.add(id)
            for id, pending in late:
                self._pool.abandon(id)
                why = (f"no line within the backstop of {limit:.0f} s after its judging began; its children were "
                       f"ended and the service went on")
                _deliver(pending, self._unjudged(id, pending, "timeout", why))


def _deliver(pending: _Pending, line: dict) -> None:
    if pending.folder is not None:
        shutil.rmtree(pending.folder, ignore_errors=True)
    pending.future.set_result(line)
