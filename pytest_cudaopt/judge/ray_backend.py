"""Many hosts through Ray: one actor per node runs the local pool over that node's GPUs, fed workdirs as bytes by the driver as it keeps up; lines streamed back as they finish; the workdirs of a node that died judged again elsewhere and counted once.
Ray is an optional extra (`pip install -e ".[ray]"`); nothing here imports it before `lines()`."""

from __future__ import annotations

import collections
import os
import queue
import shutil
import signal
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pytest_cudaopt.judge import copies, lines
from pytest_cudaopt.judge.devices import DeviceSet, cpu_slots, gpus
from pytest_cudaopt.judge.options import Options, result_key

RETRIES = 3    # times a workdir is judged again after the node judging it died
PROBE_S = 5.0  # how long the driver waits for a cluster's address to accept a connection
POLL_S = 5.0   # how long one call for a node's finished lines waits for the first of them
START_S = 600.0  # how long a node's judge may take to come up (Ray places it, it imports the judge)
STOP_S = 30.0   # how long an interrupted driver waits for the judges to end their children (SIGTERM, then SIGKILL)


class NodeJudge:
    """One node's judge (a Ray actor holding its node's GPUs, or one CPU): the local pool, fed tar bytes by `judge`.
    `devices` and `run_stage`: tests."""

    def __init__(self, options_json: dict, devices: DeviceSet | None = None,
                 run_stage: Callable[..., Any] | None = None):
        from pytest_cudaopt.judge.pool import LocalPool
        from pytest_cudaopt.run.scratch import own_folder

        options = Options.from_json(options_json)
        options.scratch = None
        if devices is None:
            devices = cpu_slots(options.cpu_slots) if options.cpu else gpus(_ray_gpu_ids())
        self.shipped = own_folder("ray")   # a killed node judge's is removed by the next on its host
        self.pool = LocalPool([], options, devices, fed=True, run_stage=run_stage)
        # Workdirs in hand: builds and policy checks running and as many waiting, checks on every device and a
        # perf stage waiting for each: what keeps the pipeline full between feeds.
        self.capacity = 2 * options.cpu_jobs + len(devices.names) * (options.share + 2)
        self._done: queue.Queue = queue.Queue()
        self._lock = threading.Lock()   # judge() runs on several of the actor's threads
        self._folders: dict[str, Path] = {}   # key -> where its shipped files were unpacked
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in self.pool.lines():
                line["pid"] = os.getpid()
                with self._lock:
                    folder = self._folders.pop(line["key"], None)
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
                self._done.put(line)
        except BaseException as exc:  # noqa: BLE001 - the driver turns it into each workdir's line
            self._done.put({"failed": f"{type(exc).__name__}: {exc}"})
        finally:
            shutil.rmtree(self.shipped, ignore_errors=True)

    def describe(self) -> dict:
        import socket

        return {"host": socket.gethostname(), "devices": list(self.pool.devices.names), "capacity": self.capacity}

    def judge(self, packed: bytes, name: str, key: str) -> None:
        """One more workdir, its files as `copies.pack` made them; its line keeps `name` and `key`."""
        folder = Path(tempfile.mkdtemp(dir=self.shipped))
        with self._lock:
            self._folders[key] = folder
        copy = folder / (Path(name).name or "workdir")
        try:
            copies.unpack(packed, copy)
        except (OSError, copies.CopyError, tarfile.TarError) as exc:
            with self._lock:
                self._folders.pop(key, None)
            shutil.rmtree(folder, ignore_errors=True)
            self._done.put(lines.unjudged(name, key, "error", f"could not unpack {name} on this node: {exc}"))
            return
        self.pool.add(copy, name, key)

    def lines(self, wait_s: float = POLL_S) -> list[dict]:
        """The lines finished since the last call: waits up to `wait_s` for the first."""
        found: list[dict] = []
        try:
            found.append(self._done.get(timeout=wait_s))
            while True:
                found.append(self._done.get_nowait())
        except queue.Empty:
            return found

    def stats(self) -> dict:
        self._thread.join(timeout=60)
        return {"busy": dict(self.pool.busy), "wall_s": self.pool.wall_s}

    def close(self) -> None:
        self.pool.close()

    def stop(self, why: str) -> None:
        """Every child ended, before the driver ends this actor (its children would outlive it)."""
        self.pool.stop(why)
        self._thread.join(timeout=STOP_S)


def _ray_gpu_ids() -> list[str] | None:
    import ray

    return [str(i) for i in ray.get_gpu_ids()] or None


class _Node:
    """The driver's view of one node's judge: its handle, what it was given, what it holds."""

    def __init__(self, handle, node_id: str, capacity: int, host: str):
        self.handle, self.node_id, self.capacity, self.host = handle, node_id, capacity, host
        self.holding: dict[str, tuple[str, Path]] = {}   # key -> (name, workdir)
        self.poll = None


class RayPool:
    """Judges `workdirs` on the Ray cluster at `address` ("auto", "ray://...", "local"): one `NodeJudge` per node
    with a GPU (any, for CPU workdirs). `actor`, `actor_args`: tests."""

    def __init__(self, workdirs: Sequence[Path], options: Options, address: str = "auto",
                 retries: int = RETRIES, actor: type | None = None, actor_args: Sequence[Any] = ()):
        self.workdirs = [Path(w) for w in workdirs]
        self.names = [str(w) for w in self.workdirs]
        self.options, self.address, self.retries = options, address, retries
        self.actor, self.actor_args = actor or NodeJudge, tuple(actor_args)
        self.busy: dict[str, float] = {}
        self.wall_s = 0.0
        self.node_wall_s: dict[str, float] = {}   # each node's pool: wall seconds from its start to its last line
        self.duplicates = 0
        self.restarts = 0
        self._starting: dict[Any, tuple[Any, str, float]] = {}   # describe() call -> (judge, node, since)
        self._stopping: str | None = None

    def stop(self, why: str) -> None:
        """As an interrupt in `lines()`: every judge stopped, a `cancelled` line for each workdir left, then it raises
        KeyboardInterrupt (an interrupt raised while its caller wrote a line, outside it)."""
        self._stopping = why

    def _start_missing(self, judges: list[_Node]) -> None:
        """Start a judge on every live node that has none and starts none, holding the node's GPUs (or one CPU)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        have = {j.node_id for j in judges} | {node_id for _, node_id, _ in self._starting.values()}
        kind = "CPU" if self.options.cpu else "GPU"
        for node in ray.nodes():
            if node["NodeID"] in have or not node.get("Alive") or node.get("Resources", {}).get(kind, 0) < 1:
                continue
            gpus_there = 0 if self.options.cpu else int(node.get("Resources", {}).get("GPU", 0))
            handle = ray.remote(self.actor).options(
                num_cpus=1, num_gpus=gpus_there, max_concurrency=4, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(self.options.to_json(), *self.actor_args)
            self._starting[handle.describe.remote()] = (handle, node["NodeID"], time.monotonic())

    def lines(self) -> Iterator[dict]:
        start = time.monotonic()
        try:
            import ray

            if not ray.is_initialized():
                probe(self.address)
                _keeping_sigterm(ray.init, address=None if self.address == "local" else self.address,
                                 log_to_driver=False)
        except ImportError as exc:
            yield from self._unjudged(self.names, f"not judged: the Ray backend needs the ray extra "
                                                  f"(pip install -e '.[ray]'): {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - ConnectionError, a refused address, Ray's own errors
            yield from self._unjudged(self.names, f"not judged: no Ray cluster answered at --ray {self.address} "
                                                  f"({type(exc).__name__}: {_first(exc)}); start one (`ray start --head`) "
                                                  f"or name the address of one that runs")
            return
        judges: list[_Node] = []
        finished = False
        told: set[str] = set()
        try:
            self._start_missing(judges)
            for line in self._judge(ray, judges):
                told.add(line["workdir"])
                yield line
            finished = True
        except KeyboardInterrupt:   # as the local pool: every child ended, a `cancelled` line for each workdir left
            why = self._stopping or "the judge was interrupted"
            held = {name for judge in judges for name, _ in judge.holding.values()}
            if judges:
                ray.wait([judge.handle.stop.remote(why) for judge in judges], num_returns=len(judges),
                         timeout=STOP_S)
            for name in self.names:
                if name not in told:
                    yield lines.unjudged(name, result_key(name, "", self.options), "cancelled",
                                         lines.cancelled_reason(why, name in held))
            raise
        finally:
            self._wind_down(ray, judges, stats=finished)
            self.wall_s = time.monotonic() - start

    def _judge(self, ray, judges: list[_Node]) -> Iterator[dict]:
        todo = collections.deque(zip(self.names, self.workdirs))
        tries: dict[str, int] = {}      # per key: the deaths of the judges that held it
        attempts = lines.Attempts(self.options.judge_again)   # per key: its lines (judged again for the environment)
        seen: set[str] = set()
        while todo or any(j.holding for j in judges):
            if self._stopping is not None:
                raise KeyboardInterrupt
            if not judges and not self._starting:
                kind = "a CPU" if self.options.cpu else "a GPU"
                yield from self._unjudged([name for name, _ in todo], f"not judged: no live node of the Ray cluster at "
                                                                       f"--ray {self.address} has {kind} to judge on")
                return
            for judge in judges:
                yield from self._feed(judge, todo)
                if judge.poll is None:
                    judge.poll = judge.handle.lines.remote(POLL_S)
            ready, _ = ray.wait([j.poll for j in judges] + list(self._starting), num_returns=1, timeout=2 * POLL_S)
            if not ready:   # a judge not up within START_S (its node's resources held elsewhere) is ended
                for ref, (handle, _, since) in list(self._starting.items()):
                    if time.monotonic() - since > START_S:
                        del self._starting[ref]
                        ray.kill(handle)
                continue
            if ready[0] in self._starting:
                handle, node_id, _ = self._starting.pop(ready[0])
                try:
                    about = ray.get(ready[0])
                except ray.exceptions.RayError:   # the node died or cannot hold a judge: the others go on
                    continue
                judges.append(_Node(handle, node_id, about["capacity"], about["host"]))
                continue
            judge = next(j for j in judges if j.poll == ready[0])
            judge.poll = None
            try:
                found = ray.get(ready[0])
            except ray.exceptions.RayError as exc:   # the node or its judge died: its workdirs go elsewhere
                judges.remove(judge)
                yield from self._lost(judge, exc, todo, tries)
                self.restarts += 1
                self._start_missing(judges)
                continue
            for line in found:
                if "failed" in line:   # the node's pool itself failed: what it held gets lines saying so
                    judges.remove(judge)
                    ray.kill(judge.handle)
                    yield from self._unjudged([name for name, _ in judge.holding.values()],
                                              f"not judged: the judge on {judge.host} failed: {line['failed']}")
                    break
                held = judge.holding.pop(line["key"], None)
                if line["key"] in seen:   # exactly once, whatever re-ran
                    self.duplicates += 1
                    continue
                if attempts.again(line["key"], line, allowed=held is not None):
                    todo.appendleft(held)   # judged again at once, ahead of the workdirs still queued
                    continue
                seen.add(line["key"])
                yield line

    def _feed(self, judge: _Node, todo: collections.deque) -> Iterator[dict]:
        """Give `judge` workdirs until it holds its capacity; one that cannot be packed gets its line instead."""
        while todo and len(judge.holding) < judge.capacity:
            name, workdir = todo.popleft()
            try:
                packed, content = copies.pack(workdir)
            except (OSError, copies.CopyError) as exc:
                yield from self._unjudged([name], f"could not ship {workdir}: {exc}")
                continue
            key = result_key(name, content, self.options)
            judge.holding[key] = (name, workdir)
            judge.handle.judge.remote(packed, name, key)

    def _lost(self, judge: _Node, exc: BaseException, todo: collections.deque,
              tries: dict[str, int]) -> Iterator[dict]:
        """The workdirs a dead judge held: each judged again first, or its line once it died `retries` times."""
        first = _first(exc)
        for key, (name, workdir) in reversed(list(judge.holding.items())):
            tries[key] = tries.get(key, 0) + 1
            if tries[key] > self.retries:
                yield lines.unjudged(name, key, "error", f"the Ray node judging it ({judge.host}) died "
                                                         f"{tries[key]} times, retried {self.retries}: {first}")
            else:
                todo.appendleft((name, workdir))
        judge.holding.clear()

    def _wind_down(self, ray, judges: list[_Node], stats: bool) -> None:
        """Each judge closes its pool (after a run to its end, its stats are kept), then all end."""
        for handle, _, _ in self._starting.values():
            _quietly(ray.kill, handle)
        self._starting.clear()
        for judge in judges:
            _quietly(judge.handle.close.remote)
        for judge in judges if stats else []:
            try:
                kept = ray.get(judge.handle.stats.remote(), timeout=120)
            except Exception:  # noqa: BLE001 - a judge that died with the run keeps no stats
                continue
            self.node_wall_s[judge.host] = kept["wall_s"]
            self.busy.update({f"{judge.host}:{name}": share for name, share in kept["busy"].items()})
        for judge in judges:
            _quietly(ray.kill, judge.handle)

    def _unjudged(self, names: Sequence[str], reason: str) -> Iterator[dict]:
        for name in names:
            yield lines.unjudged(name, result_key(name, "", self.options), "error", reason)


def _keeping_sigterm(call: Callable[..., Any], **kwargs: Any) -> None:
    """`ray.init` with the SIGTERM handler it replaces (an exit with no line for the workdirs left) put back:
    `cudaopt judge`'s, which ends the run as Ctrl-C does."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        call(**kwargs)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _quietly(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except Exception:  # noqa: BLE001 - a judge already gone
        pass


def _first(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def probe(address: str, wait_s: float = PROBE_S) -> None:
    """Raise ConnectionError at once when nothing accepts connections at the cluster's address, instead of Ray's
    own retries for minutes."""
    import socket

    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return   # Ray says what is wrong with it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=wait_s).close()
    except OSError as exc:
        raise ConnectionError(f"nothing accepts connections at {host}:{port}: {exc}") from None
