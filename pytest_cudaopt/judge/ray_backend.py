"""Many hosts through Ray: one task per workdir (num_gpus=1), the workdir shipped as bytes, lines streamed back as tasks finish, a task whose worker or node died retried and counted once.

Ray is an optional extra (`pip install -e ".[ray]"`); nothing here imports it before `lines()`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pytest_cudaopt.judge import copies, lines
from pytest_cudaopt.judge.devices import cpu_slots, gpus
from pytest_cudaopt.judge.options import Options, result_key

RETRIES = 3   # re-runs of a task whose worker process or node died (Ray's max_retries)
PROBE_S = 5.0  # how long the driver waits for a cluster's address to accept a connection


def remote_judge(packed: bytes, name: str, key: str, options_json: dict) -> dict:
    """The body of one Ray task: unpack the workdir into a private folder, judge it on the GPU
    Ray gave this task (or one CPU slot), return its line (`workdir` as the driver named it)."""
    from pytest_cudaopt.judge.pool import LocalPool

    options = Options.from_json(options_json)
    options.scratch, options.jobs = None, 1
    if options.cpu:
        devices = cpu_slots(1)
    else:
        import ray

        devices = gpus([str(i) for i in ray.get_gpu_ids()] or None)
    with tempfile.TemporaryDirectory(prefix="cudaopt-ray-") as tmp:
        copy = Path(tmp) / "shipped" / (Path(name).name or "workdir")
        copies.unpack(packed, copy)
        pool = LocalPool([copy], options, devices, names=[name])
        line = next(iter(pool.lines()))
    line["key"], line["pid"] = key, os.getpid()
    return line


class RayPool:
    """Judges `workdirs` as Ray tasks on the cluster at `address` ("auto", "ray://...", or
    "local" for a cluster of this process's own). `task` replaces the task body (tests: a worker
    that dies); `init` are extra ray.init arguments (tests: num_cpus)."""

    def __init__(self, workdirs: Sequence[Path], options: Options, address: str = "auto",
                 names: Sequence[str] | None = None, retries: int = RETRIES,
                 task: Callable[..., dict] | None = None, init: dict[str, Any] | None = None):
        self.workdirs = [Path(w) for w in workdirs]
        self.names = list(names) if names is not None else [str(w) for w in self.workdirs]
        self.options, self.address, self.retries = options, address, retries
        self.task, self.init = task or remote_judge, dict(init or {})
        self.busy: dict[str, float] = {}
        self.wall_s = 0.0
        self.duplicates = 0

    def _remote(self):
        import ray

        if not ray.is_initialized():
            probe(self.address)
            ray.init(address=None if self.address == "local" else self.address,
                     log_to_driver=False, **self.init)
        resources = {"num_cpus": 1} if self.options.cpu else {"num_cpus": 1, "num_gpus": 1}
        # max_retries: Ray re-runs a task whose worker or node died; a task that raised is not
        # re-run (retry_exceptions=False): its judging ran, and its error is its line.
        return ray.remote(max_retries=self.retries, retry_exceptions=False, **resources)(self.task)

    def lines(self) -> Iterator[dict]:
        import time

        start = time.monotonic()
        try:
            import ray

            remote = self._remote()
        except ImportError as exc:
            yield from self._unjudged(f"not judged: the Ray backend needs the ray extra "
                                      f"(pip install -e '.[ray]'): {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - ConnectionError, a refused address, Ray's own errors
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            yield from self._unjudged(f"not judged: no Ray cluster answered at --ray {self.address} "
                                      f"({type(exc).__name__}: {first}); start one (`ray start --head`) or name "
                                      f"the address of one that runs")
            return
        pending: dict[Any, tuple[str, str]] = {}
        for name, workdir in zip(self.names, self.workdirs):
            try:
                packed, content = copies.pack(workdir)
            except (OSError, copies.CopyError) as exc:
                yield lines.unjudged(name, result_key(name, "", self.options), "error", f"could not ship {workdir}: {exc}")
                continue
            key = result_key(name, content, self.options)
            pending[remote.remote(packed, name, key, self.options.to_json())] = (name, key)
        seen: set[str] = set()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            name, key = pending.pop(ready[0])
            try:
                line = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                line = lines.unjudged(name, key, "error", f"the Ray task ended without a result "
                                                          f"(after up to {self.retries} retries): {first}")
            if line.get("key") in seen:   # exactly once, whatever re-ran
                self.duplicates += 1
                continue
            seen.add(line["key"])
            yield line
        self.wall_s = time.monotonic() - start

    def _unjudged(self, reason: str) -> Iterator[dict]:
        for name in self.names:
            yield lines.unjudged(name, result_key(name, "", self.options), "error", reason)


def probe(address: str, wait_s: float = PROBE_S) -> None:
    """Raise ConnectionError at once when nothing accepts connections at the cluster's address
    (`host:port` or `ray://host:port`; "auto" and "local" are Ray's to find or start), instead
    of Ray's own retries for minutes."""
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
