"""The judging side of a worker: start it, send requests, read replies through an allow-list, and turn a worker that dies, hangs or lies into a failure with its reason.

protocol.receive resolves only dtypes, devices, sizes and tensor rebuilds: a crafted pickle runs no code here."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pytest_cudaopt import wire as protocol
from pytest_cudaopt.remote import timing
from pytest_cudaopt.run import watchdog, zygote
from pytest_cudaopt.remote.candidate import WorkerError, WorkerFailed, describe  # noqa: F401 - imported from here
from pytest_cudaopt.run.scratch import own_folder, weigh

POLL_S = 0.05          # how often a wait for a reply looks at the worker's process
STACK_WAIT_S = 3.0     # after SIGUSR1, the most time for the worker to print its stacks
STACK_QUIET_S = 0.3    # ... and how long its log must hold still for the dump to count as done
LAST_WORDS = 4000      # characters of the worker's output quoted when it dies
WEIGH_S = 0.5          # how often the worker's scratch folder (its one writable folder, its log in it) is weighed
MOST_FILES = 100_000   # ... and the most entries it may hold (a weighing stays cheap)
GiB = 1 << 30
# How a worker refused by cudaopt_sandbox=require begins its report (the CI gate blames the runner).
REQUIRE_REFUSED = "cudaopt_sandbox=require: the candidate's worker could not be confined"
# What a worker keeps of the judging process's environment: what torch, CUDA and the toolchain need.
KEPT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
            "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT",
            "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING",
            "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "TORCH_CUDA_ARCH_LIST",
            "PYTHONPYCACHEPREFIX")   # read only: PYTHONDONTWRITEBYTECODE (worker_env)
KEPT_PREFIXES = ("LC_",)

_LIVE: set["Worker"] = set()


@atexit.register
def _stop_all() -> None:
    """No worker outlives the judging process, however it ends."""
    for worker in list(_LIVE):
        worker.stop()


def worker_env(base: Mapping[str, str], package_root: str, secrets: Iterable[str] = ()) -> dict[str, str]:
    """The KEPT_ENV names of `base`, none whose value names one of `secrets`, PYTHONPATH from `package_root`."""
    secrets = [s for s in secrets if s]
    env = {k: v for k, v in base.items()
           if (k in KEPT_ENV or k.startswith(KEPT_PREFIXES)) and not any(s in v for s in secrets)}
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH", "")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def package_root() -> str:
    import pytest_cudaopt

    return str(Path(pytest_cudaopt.__file__).resolve().parent.parent)


class Reply(dict):
    """A worker's reply: a key it lacks is the candidate's process's fault (a forged or stray reply), not ours."""
    what = ""

    def __missing__(self, key: Any) -> Any:
        raise WorkerFailed(f"the candidate's worker process answered without {key!r} while {self.what}")


class Worker:
    """One worker process for one workdir: `start()`, `request(...)`, `stop()`."""

    def __init__(self, workdir: Path, extension: Path | None, device: str = "cpu", *,
                 secrets: Iterable[str] = (), sandbox: str = "auto", scratch_limit: float | None = None):
        self.workdir = Path(workdir).resolve()
        self.extension = Path(extension).resolve() if extension is not None else None
        self.device = device
        self.secrets = [str(s) for s in secrets if s]
        self.sandbox = sandbox
        self.confined: dict = {}
        self.proc: subprocess.Popen | zygote.Forked | None = None
        self.conn: Connection | None = None
        self.builds: Path | None = None  # the folder its sandbox lets it read the extension from
        self.scratch: Path | None = None
        self.log_path: Path | None = None
        self.facts: dict = {}
        self._relayed = 0
        self._pool = None    # the CUDA memory pool of what the worker is sent
        self.arena: protocol.Arena | None = None
        self.dropped: list[int] = []  # ids of ModelNew objects to free with the next request
        self.calibrated_ping: float | None = None  # the median ping before the workdir loaded
        self.stream_gate = None   # window.JudgeWindow on CUDA, calibrated before the workdir loaded
        self.stream_gate_error = ""  # ... else why not
        self._sandbox_reply: dict | None = None   # taken early by make_context, for `start`
        self.scratch_limit = scratch_limit   # GiB its scratch folder may hold (cudaopt_scratch_limit; None: not weighed)
        self.overran = ""    # why it was killed for what it wrote there
        self._weighing = threading.Event()   # set: the weighing ends

    def launch(self, builds: Path | None = None) -> "Worker":
        """Start the process and send the sandbox request, not waiting for the reply (`start` takes it)."""
        self.scratch = own_folder("worker").resolve()   # a killed owner's is removed by the next
        self.log_path = self.scratch / "worker.log"
        ours, theirs = socket.socketpair()
        log = open(self.log_path, "wb")
        try:
            env = worker_env(os.environ, package_root(), self.secrets)
            # Its temporary files and CUDA's JIT cache in its scratch folder, the one it may write.
            env.update(TMPDIR=str(self.scratch), CUDA_CACHE_PATH=str(self.scratch / "cuda-cache"))
            # Forked by a zygote where one is offered (the same process, without a torch import).
            self.proc = zygote.spawn(theirs.fileno(), log.fileno(), str(self.scratch), env) or subprocess.Popen(
                [sys.executable, "-m", "pytest_cudaopt.candidate", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], cwd=self.scratch, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: zygote.die_with_parent(signal.SIGKILL))  # never outlives this process
        finally:
            log.close()
            theirs.close()
        self.conn = Connection(ours.detach())
        _LIVE.add(self)
        if self.scratch_limit is not None:
            with contextlib.suppress(AttributeError, OSError):   # no pidfd (Linux < 5.3): not weighed
                handle = os.pidfd_open(self.proc.pid)   # the process itself, whatever number a later one gets
                threading.Thread(target=self._weigh_scratch, args=(self.scratch, handle), daemon=True,
                                 name="cudaopt-scratch-weigh").start()
        self.builds = Path(builds).resolve() if builds is not None else getattr(self.extension, "parent", None)
        from pytest_cudaopt.run.turn import PLACE, pending

        # A judge's child launches it before its place on the device: no CUDA context until the first request.
        self.send({"op": "sandbox", "mode": self.sandbox, "workdir": str(self.workdir), "device": self.device,
                   "build": str(self.builds) if self.builds else None, "scratch": str(self.scratch),
                   "context": not pending(PLACE)}, what="confining itself")
        return self

    def reads(self, extension: Path | None) -> bool:
        """Whether the sandbox this worker was sent lets it read `extension`."""
        if extension is None or self.builds is None:
            return extension is None
        return self.builds in Path(extension).resolve().parents

    def start(self, require_workdir: bool = True) -> "Worker":
        """Launch unless `launch` did, take the sandbox reply, load the workdir (WorkerError, WorkerFailed)."""
        if self.proc is None:
            self.launch()
        protocol.setup_sharing()
        work = None
        if self.device.startswith("cuda"):  # this process's own CUDA set-up, while the worker ends its start
            from pytest_cudaopt.remote.window import JudgeWork

            try:
                work = JudgeWork(self.device)
            except RuntimeError as exc:  # torch's: the gate is left out (attach_stream_gate)
                self.stream_gate_error = str(exc) or type(exc).__name__
        self.confine(self._sandbox_reply or self.receive(what="confining itself"))
        self.calibrate()
        if work is not None:
            self.attach_stream_gate(work)
        arena = protocol.Arena.create()
        try:
            self.facts = self.request({"op": "load", "workdir": str(self.workdir), "device": self.device,
                                       "extension": str(self.extension) if self.extension else None,
                                       "arena": arena.path, "arena_bytes": arena.size},
                                      timeout=None, what="loading the workdir")
        finally:
            arena.unlink()  # both processes have it mapped; nobody else can open it now
        self.arena = arena
        if require_workdir and "workdir_error" in self.facts:
            raise WorkerError(str(self.facts["workdir_error"]), kind="workdir", file=self.facts.get("file"))
        return self

    def make_context(self) -> None:
        """A worker launched before its judge's child had its place makes its CUDA context now, and this waits for
        it: a perf child's, in its place before its turn, where nothing is timed (the turn has the rest)."""
        if self.proc is None or self._sandbox_reply is not None:
            return
        self._sandbox_reply = self.receive(what="confining itself")
        self.request({"op": "context", "device": self.device}, what="making its CUDA context")

    def confine(self, reply: dict) -> None:
        """The `sandbox` reply: =require refuses an unconfined worker; without Landlock's ptrace rule, no dumps."""
        from pytest_cudaopt.run.signals import not_dumpable

        self.confined = dict(reply.get("sandbox") or {})
        missing = self.confined.get("missing", {})
        if self.sandbox == "require" and (self.confined.get("mode") != "require" or "files" in missing):
            self.stop()
            raise WorkerError(f"{REQUIRE_REFUSED}, so it is not run: "
                              f"{describe(self.confined)} (cudaopt_sandbox=auto runs it with what this kernel offers)",
                              kind="sandbox")
        if self.sandbox != "off" and "Landlock" not in " ".join(self.confined.get("held", {}).get("ptrace", [])):
            not_dumpable()

    def calibrate(self) -> None:
        """The median ping before the workdir's code runs: what `handoff_bound` caps a later ping at."""
        pings = sorted(self.ping() for _ in range(timing.CALIBRATION_PINGS))
        self.calibrated_ping = pings[len(pings) // 2]

    def attach_stream_gate(self, work=None) -> None:
        """`stream_gate` set up and calibrated before the workdir loads, or `stream_gate_error` saying why not."""
        from pytest_cudaopt.remote.window import WindowError, JudgeWindow, JudgeWork

        gate = JudgeWindow.create()
        try:
            try:
                reply = self.request({"op": "gate", "path": gate.path, "device": self.device},
                                     what="setting up the gate", relay=False)
            finally:
                gate.unlink()  # mapped by both processes now, or never to be
            if reply.get("gate_error"):
                raise WindowError(str(reply["gate_error"]))
            gate.calibrate(self, work=work if work is not None else JudgeWork(self.device))
        except (WindowError, TimeoutError, ChildProcessError, WorkerError, RuntimeError) as exc:  # torch's too
            self.stream_gate_error = str(exc) or type(exc).__name__
            return
        self.stream_gate = gate

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _weigh_scratch(self, folder: Path, handle: int) -> None:
        """Kill the worker (its pidfd, `handle`) once its scratch folder (temporary files, its printed output) holds
        more than `scratch_limit` GiB or MOST_FILES entries: a disk filled by one candidate fails its neighbours'."""
        try:
            while not self._weighing.wait(WEIGH_S):
                size, entries = weigh(folder, MOST_FILES)
                if size > self.scratch_limit * GiB or entries > MOST_FILES:
                    self.overran = (f"it wrote {size / GiB:.2f} GiB in {entries}{'+' if entries > MOST_FILES else ''}"
                                    f" files to its scratch folder (temporary files and printed output), past "
                                    f"cudaopt_scratch_limit={self.scratch_limit:g} GiB or {MOST_FILES} files")
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(handle, signal.SIGKILL)
                    return
        finally:
            os.close(handle)

    def stop(self) -> None:
        """Kill the worker and everything in its process group, now: no handler of its runs after this returns."""
        self._weighing.set()
        if self.proc is not None:
            for target in (lambda: os.killpg(self.proc.pid, signal.SIGKILL), lambda: self.proc.kill()):
                with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                    target()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        _LIVE.discard(self)
        if isinstance(self.proc, zygote.Forked):
            self.proc.close()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def _log(self, start: int = 0, size: int = -1) -> bytes:
        """Up to `size` bytes of the worker's log from `start` (b"" where there is none)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                return f.read(size)
        except (OSError, TypeError):
            return b""

    def last_words(self, limit: int = LAST_WORDS) -> str:
        return self._log().decode(errors="replace")[-limit:].strip()

    def _relay(self) -> None:
        """What the worker printed since the last reply, onto this process's stdout (pytest captures it)."""
        chunk = self._log(self._relayed, 1 << 16)
        if chunk:
            self._relayed += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))

    def _died(self, what: str) -> WorkerFailed:
        code = None
        if self.proc is not None:  # the socket closes a moment before the exit status is there
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=2)
        if code is None:
            how = "closed its socket"
        elif code < 0:
            how = f"was killed by signal {signal.Signals(-code).name}" if -code in signal.Signals._value2member_map_ \
                else f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        if self.overran:
            how = f"was killed ({self.overran})"
        return WorkerFailed(f"the candidate's worker process {how} while {what}", self.last_words())

    def request(self, message: dict, *, timeout: float | None = None, what: str = "",
                copy_back: bool = False, relay: bool = True, on_send: Callable[[], None] | None = None,
                stall: tuple[float, Callable[[], Any]] | None = None, sync_events: bool = True) -> dict:
        """Send `message`, wait for the reply: WorkerError for a reply with `error`, WorkerFailed for a dead
        worker, a non-reply or `timeout`. `copy_back`: the CPU tensors sent get the worker's writes.
        `relay=False`: no file read inside a timed round trip. `stall` (seconds, callback): run once if no
        reply came by then. `sync_events=False`: reply tensors without waiting on the worker's events."""
        what = what or f"answering {message.get('op')}"
        placed = self.send(message, what=what, on_send=on_send)
        return self.receive(what=what, timeout=timeout, placed=placed if copy_back else (), relay=relay,
                            stall=stall, sync_events=sync_events)

    def send(self, message: dict, *, what: str = "", on_send: Callable[[], None] | None = None) -> list:
        """The first half of `request`: `message` sent; the CPU tensors placed in the arena."""
        what = what or f"answering {message.get('op')}"
        if self.conn is None:
            raise WorkerFailed(f"the candidate's worker process is stopped ({what})")
        if self.dropped:  # ModelNew objects this process no longer holds: freed in the worker
            message = {**message, "drop": self.dropped}
            self.dropped = []
        try:
            return protocol.send(self.conn, message, self.arena, "judge", on_send=on_send)
        except (OSError, EOFError, BrokenPipeError):
            raise self._died(what) from None
        except protocol.Unsendable as exc:  # the worker would refuse it: nothing was sent, the worker lives
            raise WorkerError(f"{what}: {exc} from model.py cannot be sent to ModelNew's process; "
                              "get_init_inputs() and get_inputs() may return plain Python values (numbers, strings, "
                              "lists, tuples, dicts), torch dtypes, devices, sizes and tensors",
                              kind="workdir", file="model.py") from None

    def receive(self, *, what: str, timeout: float | None = None, placed: Iterable = (), relay: bool = True,
                stall: tuple[float, Callable[[], Any]] | None = None, sync_events: bool = True) -> dict:
        """The second half of `request`: the reply to what was sent last."""
        if self.conn is None:
            raise WorkerFailed(f"the candidate's worker process is stopped ({what})")
        deadline = None if timeout is None else time.monotonic() + timeout
        stall_at = None if stall is None else time.monotonic() + stall[0]
        try:
            while not self.conn.poll(POLL_S):
                if stall_at is not None and time.monotonic() > stall_at:
                    stall_at = None
                    stall[1]()
                if not self.alive():
                    if self.conn.poll(0):
                        break
                    raise self._died(what)
                if deadline is not None and time.monotonic() > deadline:
                    stacks = self.stacks()
                    self.stop()
                    failed = WorkerFailed(f"the candidate's worker process did not answer within {timeout:g}s "
                                          f"while {what}")
                    failed.worker_stacks = stacks
                    raise failed
            data = self.conn.recv_bytes()
        except (EOFError, OSError):
            raise self._died(what) from None
        except WorkerFailed:
            raise
        except BaseException as exc:  # the watchdog's timeout: where the worker was goes with it
            with watchdog.held():
                exc.worker_stacks = self.stacks()
                self.stop()
            raise
        finally:
            if relay:
                self._relay()
        try:
            reply = protocol.receive_bytes(data, self.arena, "worker", sync_events)
        except Exception as exc:  # noqa: BLE001 - whatever the bytes were, they are no reply
            self.stop()
            raise WorkerFailed(f"the candidate's worker process sent what is not a reply while {what}: "
                               f"{type(exc).__name__}: {exc}") from None
        if not isinstance(reply, dict):
            self.stop()
            raise WorkerFailed(f"the candidate's worker process sent a {type(reply).__name__}, not a reply, "
                               f"while {what}")
        if self.arena is not None:
            for tensor, start in placed:
                count = tensor.numel() * tensor.element_size()
                tensor.copy_(self.arena.bytes[start:start + count].view(tensor.dtype).view(tensor.shape))
        if "error" in reply:
            raise WorkerError(str(reply["error"]), kind=str(reply.get("kind", "candidate")),
                              file=reply.get("file"), fault=bool(reply.get("fault")), oom=reply.get("oom"))
        reply = Reply(reply)
        reply.what = what
        return reply

    def stacks(self) -> str:
        """The worker's stacks (faulthandler, on SIGUSR1), for a request that hangs."""
        if not self.alive() or not hasattr(signal, "SIGUSR1"):
            return ""
        before = self._log_size()
        try:
            os.kill(self.proc.pid, signal.SIGUSR1)
        except OSError:
            return ""
        # faulthandler writes a frame at a time: on a loaded machine the worker can be descheduled
        # between them, so the dump counts as done once the log has grown and then held still.
        deadline = time.monotonic() + STACK_WAIT_S
        size, still_since = before, None
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.05)
            now = self._log_size()
            if now != size:
                size, still_since = now, time.monotonic()
            elif still_since is not None and time.monotonic() - still_since >= STACK_QUIET_S:
                break
        return self._log(before, 1 << 20).decode(errors="replace").strip()

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except (OSError, TypeError):
            return 0

    def ping(self) -> float:
        """The round trip of a request that runs nothing of the workdir's."""
        started = time.perf_counter()
        self.request({"op": "ping"}, what="answering a ping", relay=False)
        return time.perf_counter() - started

    def cpu_seconds(self) -> float | None:
        """The worker's CPU time so far, every thread's, as the kernel counts it; None where it cannot be read."""
        if self.proc is None:
            return None
        try:
            return time.clock_gettime(((~self.proc.pid) << 3) | 2)   # CPUCLOCK_SCHED of the whole process
        except (OSError, AttributeError, OverflowError):
            return None

    def handoff_bound(self, ping: float, copied: int = 0, handles: int = 0) -> float:
        """How much longer than the call itself its round trip may take (remote/timing.py)."""
        if self.calibrated_ping is not None:
            ping = min(ping, timing.PING_CAP_FACTOR * self.calibrated_ping)
        ipc = timing.CUDA_MESSAGE_S + handles * timing.CUDA_HANDLE_S if handles else 0.0
        return timing.HANDOFF_FACTOR * ping + timing.HANDOFF_SLACK_S + copied / 1e9 + ipc

    def sharing(self):
        """A context for allocating what the worker is sent: on CUDA a pool of its own (an IPC handle maps
        the whole segment)."""
        if not self.device.startswith("cuda"):
            return contextlib.nullcontext()
        import torch

        if self._pool is None:
            self._pool = torch.cuda.MemPool()
        return torch.cuda.use_mem_pool(self._pool)
