"""The session's workers, keyed by workdir: launched ahead, started, stopped; what their sandbox held."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from pytest_cudaopt.run.signals import process_stat

STOP_WAIT_S = 1.0   # how long `hold` waits for a process it stopped to show as stopped


def _until_stopped(pids: list[int]) -> None:
    """Wait (STOP_WAIT_S at most) until each of `pids` is stopped, gone or not to be read (/proc's state T, t, X,
    Z)."""
    deadline = time.monotonic() + STOP_WAIT_S
    for pid in pids:
        while time.monotonic() < deadline:
            found = process_stat(pid)
            if found is None or found[1] in "TtXZ":
                break
            time.sleep(0.001)


class Workers:
    def __init__(self, settings):
        self.settings = settings
        self.secrets: list[str] = []  # paths no worker's environment may name (the verdict files)
        self.sandbox: dict | None = None  # what the workers' OS sandbox held (note_sandbox), once one started
        self.all: list = []
        self.launched: dict = {}  # workdir -> its worker, launched ahead (launch)
        self._policy: dict = {}  # (workdir, .so or None) -> the policy items' worker
        self._extension: dict = {}  # workdir -> the `cuda_extension` fixture's worker
        self.sanitized: dict = {}   # workdir -> its memory-safety item's children, started ahead (memsafety.verdict)
        self.begun: dict = {}       # workdir -> (its memory-safety case sent to them, `held_seconds()` then)
        self._held_s, self._held_at = 0.0, None

    def launch(self, path: Path) -> None:
        """Launch the workdir's worker now, to import torch while this process builds (its first item takes it).
        Its sandbox reads the build root, yet to be built: made here if outside the workdir, or no launch."""
        from pytest_cudaopt.extension.buildfile import build_root
        from pytest_cudaopt.remote.worker import Worker, WorkerFailed  # not the package's names: they import torch

        path = Path(path).resolve()
        root = build_root(path, self.settings)
        try:
            if path not in root.parents:
                root.mkdir(parents=True, exist_ok=True)
        except OSError:
            return  # the build says why it cannot write there
        worker = Worker(path, None, self.settings.device, secrets=self.secrets, sandbox=self.settings.sandbox,
                        scratch_limit=self.settings.scratch_limit)
        self.all.append(worker)
        try:
            self.launched[path] = worker.launch(builds=root)
        except (OSError, WorkerFailed):
            worker.stop()

    def make_context(self, path: Path) -> None:
        """The launched worker of `path` makes its CUDA context now (Worker.make_context), if there is one."""
        from pytest_cudaopt.remote.worker import WorkerError, WorkerFailed

        worker = self.launched.get(Path(path).resolve())
        if worker is not None and worker.alive():
            try:
                worker.make_context()
            except (WorkerError, WorkerFailed):
                worker.stop()   # the item's start launches another, and says there what goes wrong

    def take_launched(self, path: Path, so_path: Path | None, device: str):
        """The worker launched for `path`, now holding `so_path`, when it is alive and reads it; else None."""
        worker = self.launched.get(path)
        if worker is None or worker.device != device:
            return None
        del self.launched[path]
        if worker.alive() and worker.reads(so_path):
            worker.extension = Path(so_path).resolve() if so_path is not None else None
            return worker
        worker.stop()
        return None

    def start(self, path: Path, so_path: Path | None, device: str | None = None, require_workdir: bool = True):
        """A worker for the workdir at `path` with the extension `so_path`: WorkdirError or BuildError."""
        from pytest_cudaopt.extension import BuildError
        from pytest_cudaopt.workdir import WorkdirError
        from pytest_cudaopt.remote.worker import Worker, WorkerError, WorkerFailed

        device = device or self.settings.device
        worker = self.take_launched(Path(path).resolve(), so_path, device)
        if worker is None:
            worker = Worker(path, so_path, device, secrets=self.secrets, sandbox=self.settings.sandbox,
                            scratch_limit=self.settings.scratch_limit)
            self.all.append(worker)
        try:
            worker.start(require_workdir)
            return worker
        except WorkerError as exc:
            worker.stop()
            if exc.kind == "build":
                raise BuildError(str(exc), [], Path(so_path).parent / "build.log" if so_path else None) from None
            raise WorkdirError(str(exc), exc.file) from None
        except WorkerFailed as exc:
            worker.stop()
            raise WorkdirError(str(exc), "model_new.py") from None
        finally:
            self.note_sandbox(worker.confined)

    def note_sandbox(self, facts: dict) -> None:
        """Keep what a worker's sandbox held: the report shows the weakest of the session's workers."""
        if not facts:
            return
        if self.sandbox is None:
            self.sandbox = {"mode": facts.get("mode"), "landlock": facts.get("landlock", 0),
                            "held": {k: list(v) for k, v in facts.get("held", {}).items()},
                            "missing": dict(facts.get("missing", {})), "workers": 0}
        found = self.sandbox
        found["workers"] += 1
        for name, why in facts.get("missing", {}).items():
            found["missing"].setdefault(name, why)
        found["held"] = {k: v for k, v in found["held"].items()
                         if k in facts.get("held", {}) and k not in found["missing"]}

    def policy_worker(self, path: Path, so: Path | None):
        """The CPU worker of the workdir's policy items with the build `so`, kept for the session."""
        worker = self._policy.get((path, so))
        if worker is None or not worker.alive():
            worker = self._policy[(path, so)] = self.start(path, so, device="cpu", require_workdir=False)
        return worker

    def extension_module(self, workdir: Path, so_path: Path):
        """The `cuda_extension` fixture's extension, called in a worker of its own: never loaded here."""
        from pytest_cudaopt.workdir import WorkdirError
        from pytest_cudaopt.remote.model import RemoteExtension

        workdir = Path(workdir).resolve()
        worker = self._extension.get(workdir)
        if worker is None or not worker.alive():
            try:
                worker = self._extension[workdir] = self.start(workdir, so_path, require_workdir=False)
            except WorkdirError as exc:
                raise RuntimeError(f"the extension of {workdir} could not be loaded in its worker: {exc}") from None
        return RemoteExtension(worker)

    def hold(self, stopped: bool) -> None:
        """Stop (SIGSTOP) or continue every live worker's process group: a paused check's candidate code runs no
        thread while another workdir has the device to itself (run/turn.py)."""
        sent = signal.SIGSTOP if stopped else signal.SIGCONT
        procs = [w.proc for w in self.all if w.alive()]
        procs += [child.proc for begun, _ in self.begun.values() for child in begun.sanitized.children.values()
                  if child.proc.poll() is None]   # a memory-safety case running beside the items
        for proc in procs:
            with contextlib.suppress(OSError):
                try:
                    os.killpg(proc.pid, sent)
                except OSError:
                    os.kill(proc.pid, sent)
        if stopped:   # a signal is delivered when the process next runs: the pause is answered once each has stopped
            _until_stopped([proc.pid for proc in procs])
        if stopped and self._held_at is None:
            self._held_at = time.monotonic()
        elif not stopped and self._held_at is not None:
            self._held_s, self._held_at = self.held_seconds(), None

    def held_seconds(self) -> float:
        """Seconds this session's workers were stopped by `hold`, in all (a sanitized case's limit grows by them)."""
        return self._held_s + (time.monotonic() - self._held_at if self._held_at is not None else 0.0)

    def keep_begun(self, path: Path, begun):
        """Keep the memory-safety case `begun` for `path` (its children among those `hold` stops); `begun_for`'s."""
        self.begun[Path(path).resolve()] = (begun, self.held_seconds())
        return self.begun_for(path)

    def begun_for(self, path: Path):
        """(the memory-safety case begun for `path`, seconds held since) or None; the item decides it. Its children
        stay among those `hold` stops until the item is done (`end_begun`): it may pause while it waits on them."""
        found = self.begun.get(Path(path).resolve())
        return None if found is None else (found[0], lambda: self.held_seconds() - found[1])

    def end_begun(self, path: Path) -> None:
        self.begun.pop(Path(path).resolve(), None)

    def stop(self) -> None:
        """Kill every worker of this session (before any verdict file is written)."""
        for worker in self.all:
            worker.stop()
        for sanitized in [*self.sanitized.values(), *(begun.sanitized for begun, _ in self.begun.values())]:
            sanitized.close()
        for held in (self.all, self._policy, self._extension, self.launched, self.sanitized, self.begun):
            held.clear()

    def stop_workdir(self, path: Path) -> None:
        """Kill the workers and the sanitized children of the workdir at `path` (the rest of the session's run)."""
        path = Path(path).resolve()
        for worker in self.all:
            if worker.workdir == path:
                worker.stop()
        begun = self.begun.pop(path, None)
        for sanitized in [self.sanitized.pop(path, None), begun[0].sanitized if begun is not None else None]:
            if sanitized is not None:
                sanitized.close()

    def sanitize_ahead(self, path: Path, so_path: Path, sanitizer: str) -> None:
        """Start the memory-safety children of the workdir at `path`, built as `so_path`: they import torch while
        this process waits for its place and loads the workdir (the item takes them, `take_sanitized`)."""
        from pytest_cudaopt.memsafety.verdict import Sanitized, time_limit

        path = Path(path).resolve()
        if path in self.sanitized:
            return
        try:   # they may wait for the correctness items before them, as long again as they may then run
            self.sanitized[path] = Sanitized(path, str(so_path), self.settings.device, self.settings.sandbox, sanitizer,
                                             wait=2 * time_limit(self.settings))
        except OSError:
            pass   # the item starts them itself, and says why they do not start

    def take_sanitized(self, path: Path):
        return self.sanitized.pop(Path(path).resolve(), None)
