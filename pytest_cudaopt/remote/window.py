"""The timed window: a timed batch on a GPU bracketed by the judging process's own clock, with no pipe, wake-up or IPC inside the window."""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from pytest_cudaopt.perf.stats import median
from pytest_cudaopt.candidate.window_page import DONE, OPEN, PAGE, WindowError, WorkerWindow  # noqa: F401 - the worker's half

CHECK_EVERY_S = 0.01     # how often a spin asks whether the worker is still alive
STALL_S = 2.0            # the most a gated batch's enqueue may take before the gate is opened anyway
DONE_LIMIT_S = 120.0     # the most a gated batch may take once its gate is open
CALIBRATION_BATCHES = 24
PROBE_BYTES = 4096       # what a calibration batch copies out after DONE
# The copy's excess grows with how long the worker's context ran before DONE, whatever it wrote: on
# an H200 ~167 us after an empty batch, ~220 us after 2.5 ms of spin (benchmarks/gate_excess.py;
# benchmarks/results/2026-12-03-copy-excess.md). Calibrated after spins of these lengths too (`JudgeWindow.extra`).
SPUN_S = (1e-3, 2.5e-3, 5e-3)
SPUN_BATCHES = 6
_perf_counter = time.perf_counter


def _word(view: mmap.mmap, at: int) -> int:
    return struct.unpack_from("<I", view, at)[0]


class JudgeWindow:
    """The judging side: `create()` maps the page, `open(seq)` lets batch `seq` run, `wait_done` spins on DONE.
    `parts`/`spun`: (opening to DONE, the copy's excess) of the calibration's empty and spinning batches."""

    def __init__(self, path: str, view: mmap.mmap):
        self.path, self.view = path, view
        self.seq = 0
        self.parts: list[tuple[float, float]] = []
        self.spun: list[tuple[float, float]] = []
        self.work: JudgeWork | None = None

    @classmethod
    def create(cls) -> "JudgeWindow":
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        path = str(Path(folder, f"cudaopt-gate-{secrets.token_hex(8)}"))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, PAGE)
            view = mmap.mmap(fd, PAGE)
        finally:
            os.close(fd)
        return cls(path, view)

    def unlink(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    @property
    def windows(self) -> list[float]:
        return [a + b for a, b in self.parts]

    @property
    def median(self) -> float:
        """The calibrated windows' median: what an honest batch's window exceeds its figures by."""
        return median(self.windows) if self.parts else 0.0

    @property
    def fixed(self) -> float:
        """The 90th percentile of the calibrated windows (one slow calibration batch does not widen the bound)."""
        ordered = sorted(self.windows)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else 0.0

    def extra(self, window: float) -> float:
        """What a batch of `window` adds to an empty batch's copy excess: linear through the calibrated points."""
        if not self.spun or not self.parts:
            return 0.0
        points = [(median([a for a, _ in self.parts]), 0.0)]
        base = median([b for _, b in self.parts])
        for at, excess in sorted(self.spun):
            if at > points[-1][0]:
                points.append((at, max(points[-1][1], excess - base)))
        for (w0, e0), (w1, e1) in zip(points, points[1:]):
            if window <= w1:
                return e0 + (e1 - e0) * max(0.0, window - w0) / (w1 - w0)
        return points[-1][1]

    def next(self) -> int:
        self.seq += 1
        return self.seq

    def open(self, seq: int) -> float:
        """Let batch `seq` (and every earlier one) run; the host time it was opened."""
        now = _perf_counter()
        if _word(self.view, OPEN) < seq:
            struct.pack_into("<I", self.view, OPEN, seq)
        return now

    def wait_done(self, seq: int, alive: Callable[[], bool], limit: float = DONE_LIMIT_S) -> float:
        """Spin until the worker wrote `seq` into DONE: the host time it was seen."""
        view = self.view
        started = checked = _perf_counter()
        while _word(view, DONE) < seq:
            now = _perf_counter()
            if now - checked > CHECK_EVERY_S:
                checked = now
                if not alive():
                    raise ChildProcessError("the worker ended before its gated batch was done")
                if now - started > limit:
                    raise TimeoutError(f"the worker's gated batch was not done within {limit:g} s of its gate opening")
        return _perf_counter()

    def calibrate(self, worker: Any, batches: int = CALIBRATION_BATCHES, work: "JudgeWork | None" = None) -> None:
        """Empty gated batches framed as real ones by `work` (the GPU switches contexts at both ends, ~150 us
        each on an H200): `parts`; then batches that spin SPUN_S: `spun`."""
        self.work = work
        for _ in range(batches):
            self.parts.append(self.probe(worker, PROBE_BYTES if work is not None else 0))
        rate = work.cycles_per_second() if work is not None else 0.0
        for spin in SPUN_S if rate else ():
            found = [self.probe(worker, PROBE_BYTES, cycles=int(spin * rate)) for _ in range(SPUN_BATCHES)]
            self.spun.append((median([a for a, _ in found]), median([b for _, b in found])))

    def probe(self, worker: Any, nbytes: int, count: int = 1, cycles: int = 0) -> tuple[float, float]:
        """One empty gated batch, copied out as a real batch's: (opening to DONE, the copy's excess)."""
        work = self.work
        seq = self.next()
        stalled: list[float] = []
        try:
            reply = worker.request({"op": "gated", "seq": seq, "inputs": [],
                                    "probe": {"bytes": nbytes, "count": count, "cycles": cycles} if nbytes else None},
                                   what="an empty gated batch", relay=False, sync_events=False,
                                   stall=(STALL_S, lambda: stalled.append(self.open(seq))))
            if stalled:
                raise WindowError(f"an empty gated batch's enqueue did not come back within {STALL_S:g} s")
            outputs = list(reply.get("outputs") or [])
            pairs = [(work.torch.empty_like(o), o) for o in outputs] if work is not None else []
            if work is not None:
                work.fill([])
            opened = self.open(seq)
            seen = self.wait_done(seq, worker.alive, limit=STALL_S + cycles * 1e-9)   # a GPU spins >= 1 GHz
            excess = work.excess(seen, pairs)[0] if work is not None else 0.0
        finally:
            self.open(seq)
        worker.request({"op": "collect"}, what="an empty gated batch's figures", relay=False)
        del reply, outputs, pairs   # as a real batch's: released after the collect
        return seen - opened, excess


class JudgeWork:
    """The judging process's own GPU work around a gated batch, on a stream of its own: `fill` and `excess`."""

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.rate = 0.0
        l2 = int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or 0)
        self.stream = torch.cuda.Stream(self.device)
        self.filled = torch.cuda.Event()
        self.before, self.after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.l2_flush = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=self.device)
        self.fill([])   # the kernels loaded and the events created before any gate closes
        self.excess(_perf_counter(), self.buffers(PROBE_BYTES))

    def cycles_per_second(self) -> float:
        """The GPU's spin rate (torch.cuda._sleep's cycles a second), measured once."""
        if not self.rate:
            from pytest_cudaopt.perf.clocks import GpuLead

            lead = GpuLead(self.device)
            lead.calibrate()
            self.rate = lead.cycles_per_second
        return self.rate

    def buffers(self, nbytes: int) -> list[tuple[Any, Any]]:
        """One (destination, source) pair of `nbytes` each, of this process's."""
        torch = self.torch
        return [(torch.empty(nbytes, dtype=torch.uint8, device=self.device),
                 torch.ones(nbytes, dtype=torch.uint8, device=self.device))]

    def _spin(self, event: Any) -> float:
        while not event.query():
            pass
        return _perf_counter()

    def fill(self, pairs: list[tuple[Any, Any]]) -> None:
        with self.torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src)
            self.l2_flush.zero_()   # the inputs were just written: out of L2, as an in-process call finds them
            self.filled.record(self.stream)
        self._spin(self.filled)

    def excess(self, seen: float, pairs: list[tuple[Any, Any]]) -> tuple[float, float]:
        """Copy `pairs` now: (host time from `seen` to the copy's end beyond its GPU time, that GPU time)."""
        with self.torch.cuda.stream(self.stream):
            self.before.record(self.stream)
            if pairs:   # one launch for them all: a launch each adds its host time to the window (~7 us)
                self.torch._foreach_copy_([dst for dst, _ in pairs], [src for _, src in pairs])
            self.after.record(self.stream)
        ended = self._spin(self.after)
        copy_s = self.before.elapsed_time(self.after) / 1e3
        return max(0.0, ended - seen - copy_s), copy_s
