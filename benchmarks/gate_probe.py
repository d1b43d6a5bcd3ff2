"""Can the judging process time a worker's batch by its own clock, with no pipe inside the window? A probe of the gate (pytest_cudaopt/remote/window.py) step by step, each with a time limit, printing as it goes.

    python3 benchmarks/gate_probe.py [--confine] [--reps 100] [--out DIR]      # needs a CUDA device

In one process: the driver's stream-memory-operation attributes; a stream (the current one, then
a side stream) that waits on a word of a registered /dev/shm page, released by a host thread of the
same process (everything allocated before the wait: an allocation behind a closed gate may
synchronise the device and never return). Then across two processes, as the harness does it: the empty
gated batch (the window's fixed cost), batches of B calls of a ~20 us element-wise kernel (the
window against the sum of the worker's chained events), and the delay of the judging process's
own kernel right after `done` while the worker's context is still busy; with --confine also with
the worker in its OS sandbox. Two more steps show why a gate alone is not a bound and what is
(benchmarks/results/2026-12-03-timed-batches.md): a worker that does its calls before the gate and leaves only
its events behind it (the window sees none of its work), and the inputs written into buffers
shared once, by the judging process inside the window (that worker's outputs are then wrong).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import mmap
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
pc = time.perf_counter
from pytest_cudaopt.remote.window import DONE, OPEN, PAGE, JudgeWindow, WorkerWindow  # noqa: E402

# ---- the probe ----
ATTRIBUTES = {91: "can_use_host_pointer_for_registered_mem", 92: "can_use_stream_mem_ops_v1",
              93: "can_use_64_bit_stream_mem_ops_v1", 94: "can_use_stream_wait_value_nor_v1"}


def say(*parts) -> None:
    print(*parts, flush=True)


def med(values):
    return statistics.median(values) if values else float("nan")


def wait_word(view, at: int, value: int, limit: float) -> float | None:
    started = pc()
    while struct.unpack_from("<I", view, at)[0] != value:
        if pc() - started > limit:
            return None
    return pc() - started


# ------------------------------------------------------------------------------ one process


def single_process() -> dict:
    import torch

    found: dict = {}
    driver = ctypes.CDLL("libcuda.so.1")
    torch.zeros(1, device="cuda")
    for number, name in ATTRIBUTES.items():
        value = ctypes.c_int(-1)
        got = driver.cuDeviceGetAttribute(ctypes.byref(value), number, 0)
        found[name] = value.value if got == 0 else f"CUresult {got}"
    say("attributes:", found)
    # a registered /dev/shm page, released by a host thread of this process
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="gate-probe-")
    os.ftruncate(fd, PAGE)
    view = mmap.mmap(fd, PAGE)
    os.close(fd)
    os.unlink(path)
    try:
        gate = WorkerWindow.__new__(WorkerWindow)
        gate.torch = torch
        gate.view = view
        gate._buffer = (ctypes.c_char * PAGE).from_buffer(view)
        host = ctypes.addressof(gate._buffer)
        err = torch.cuda.cudart().cudaHostRegister(host, PAGE, 0x02)
        say("cudaHostRegister:", err)
        pointer = ctypes.c_uint64()
        got = driver.cuMemHostGetDevicePointer_v2(ctypes.byref(pointer), ctypes.c_void_p(host), 0)
        say("device pointer:", got, hex(pointer.value), "host", hex(host))
        gate.device_address = pointer.value
        gate._wait = WorkerWindow._function(driver, "cuStreamWaitValue32")
        gate._write = WorkerWindow._function(driver, "cuStreamWriteValue32")
        for stream_kind in ("current", "side"):
            stream = torch.cuda.current_stream() if stream_kind == "current" else torch.cuda.Stream()
            with torch.cuda.stream(stream):
                seq = struct.unpack_from("<I", view, DONE)[0] + 1
                x = torch.ones(1 << 20, device="cuda")   # no allocation behind the gate (cudaMalloc may synchronise)
                x.mul_(2)   # and no first launch: a lazily loaded kernel's module load waits for the device
                torch.cuda.synchronize()
                say(f"  {stream_kind} stream {stream.cuda_stream:#x}: wait on {gate.device_address + OPEN:#x} >= {seq}")
                gate.wait(seq)
                say("  wait enqueued; kernel")
                x.mul_(2)
                say("  kernel enqueued; done write")
                gate.done(seq)
                say("  done write enqueued; a host thread opens the gate in 50 ms")
                threading.Timer(0.05, lambda s=seq: struct.pack_into("<I", view, OPEN, s)).start()
                took = wait_word(view, DONE, seq, 5.0)
                say(f"registered page, {stream_kind} stream, released by a host thread after 50 ms:",
                    "done after %.1f ms" % (1e3 * took) if took is not None else "NOT DONE within 5 s")
                found[f"registered_{stream_kind}"] = took
                if took is None:
                    struct.pack_into("<I", view, OPEN, seq)
                    return found
        torch.cuda.synchronize()
    finally:
        pass
    return found


# ------------------------------------------------------------------------------ two processes


def child(fd: int, path: str, confine: bool) -> int:
    conn = Connection(fd)
    if confine:
        from pytest_cudaopt.candidate import sandbox

        scratch = tempfile.mkdtemp(prefix="gate-probe-")
        conn.send({"sandbox": sandbox.confine("require", str(ROOT), None, scratch)})
    import torch

    try:
        torch.zeros(1, device="cuda")
        gate = WorkerWindow(path, torch)
    except Exception as exc:  # noqa: BLE001 - the probe reports what failed
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    conn.send({"ok": True})
    x, events = [], []
    while True:
        req = conn.recv()
        op = req["op"]
        if op == "stop":
            return 0
        if op == "inputs":
            x = [torch.randn(req["n"], device="cuda") for _ in range(req["b"])]
            events = [torch.cuda.Event(enable_timing=True) for _ in range(req["b"] + 1)]
            for e in events:   # created now (lazily at a first record otherwise), and the output's block cached:
                e.record()     # nothing behind the gate may allocate
            x[0].mul(2.0)
            torch.cuda.synchronize()
            conn.send({})
        elif op == "batch":
            seq, calls, spin, early = req["seq"], req["calls"], req.get("spin_after", 0), req.get("early", False)
            torch.cuda.synchronize()
            t0 = pc()
            if early:  # the adversary: the work before the gate, only the events behind it
                for i in range(calls):
                    x[i].mul(2.0)
            gate.wait(seq)
            events[0].record()
            for i in range(calls):
                if not early:
                    x[i].mul(2.0)
                events[i + 1].record()
            gate.done(seq)
            if spin:
                torch.cuda._sleep(spin)
            conn.send({"enqueue_s": pc() - t0})
            conn.recv()  # collect
            torch.cuda.synchronize()
            conn.send({"figures": [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(calls)]})
        elif op == "ping":
            conn.send({})
        elif op == "slots":  # the judging process's input buffers, shared once; outputs of our own
            xs = req["x"]
            ys = [torch.empty_like(t) for t in xs]
            fev = [torch.cuda.Event(enable_timing=True) for _ in range(len(xs) + 1)]
            for e in fev:
                e.record()
            torch.mul(xs[0], 2.0, out=ys[0])
            torch.cuda.synchronize()
            conn.send({})
        elif op == "fbatch":
            seq, calls, early = req["seq"], req["calls"], req.get("early", False)
            torch.cuda.synchronize()
            t0 = pc()
            if early:  # the adversary again: on what the buffers hold before the window
                for i in range(calls):
                    torch.mul(xs[i], 2.0, out=ys[i])
            gate.wait(seq)
            fev[0].record()
            for i in range(calls):
                if not early:
                    torch.mul(xs[i], 2.0, out=ys[i])
                fev[i + 1].record()
            gate.done(seq)
            conn.send({"enqueue_s": pc() - t0})
            conn.recv()  # collect
            torch.cuda.synchronize()
            conn.send({"figures": [fev[i].elapsed_time(fev[i + 1]) / 1e3 for i in range(calls)],
                       "samples": [ys[i][:4].tolist() for i in range(calls)]})


def _start_child(gate: JudgeWindow, confine: bool):
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(theirs.fileno()), gate.path]
                            + (["--confine"] if confine else []), pass_fds=[theirs.fileno()])
    theirs.close()
    return proc, Connection(ours.detach())


@contextlib.contextmanager
def _child_session(proc, conn, found: dict, what: str):
    """A step's talk with its child: the child is told to stop when the block ends (by a return
    too) and killed if it is still there; an exception ends the step, kept in `found` beside
    what was found before it."""
    try:
        yield
        with contextlib.suppress(OSError):
            conn.send({"op": "stop"})
        proc.wait(timeout=30)
    except Exception as exc:  # noqa: BLE001 - reported with what was found so far
        found["error"] = f"{type(exc).__name__}: {exc}"
        say(f"{what} failed:", found["error"])
    finally:
        if proc.poll() is None:
            proc.kill()


def two_processes(confine: bool, reps: int, after_step: bool = True) -> dict:
    import torch

    gate = JudgeWindow.create()
    proc, conn = _start_child(gate, confine)
    found: dict = {"confined": confine}
    with _child_session(proc, conn, found, "two processes"):
        hello = conn.recv()
        if "sandbox" in hello:
            found["sandbox_held"] = sorted(hello["sandbox"].get("held", {}))
            hello = conn.recv()
        gate.unlink()
        if "error" in hello:
            found["error"] = hello["error"]
            say("two processes:", found)
            return found
        pings = []
        for _ in range(50):
            t = pc()
            conn.send({"op": "ping"})
            conn.recv()
            pings.append(pc() - t)
        found["ping_us"] = med(pings) * 1e6
        n = 2048 * 4096  # 32 MiB in, 32 MiB out: ~20 us on an H200
        flush = torch.empty(128 << 20 >> 2, dtype=torch.int32, device="cuda")
        conn.send({"op": "inputs", "n": n, "b": 64})
        conn.recv()

        def batch(calls: int, spin_after: int = 0, after: bool = False, early: bool = False):
            seq = gate.next()
            flush.zero_()
            torch.cuda.synchronize()
            conn.send({"op": "batch", "seq": seq, "calls": calls, "spin_after": spin_after, "early": early})
            enq = conn.recv()["enqueue_s"]
            t_open = pc()
            struct.pack_into("<I", gate.view, OPEN, seq)
            took = wait_word(gate.view, DONE, seq, 5.0)
            if took is None:
                raise TimeoutError(f"batch {seq} ({calls} calls): no done word within 5 s")
            t_done = pc()
            delay = None
            if after:
                flush[:1024].add_(1)
                torch.cuda.synchronize()
                delay = pc() - t_done
            conn.send({"op": "collect"})
            figures = conn.recv()["figures"]
            return t_done - t_open, figures, enq, delay

        empty = [batch(0)[0] for _ in range(reps)]
        found["empty_window_us"] = {"median": med(empty) * 1e6, "min": min(empty) * 1e6,
                                    "p90": sorted(empty)[int(0.9 * len(empty))] * 1e6, "max": max(empty) * 1e6}
        say("empty gated batch:", found["empty_window_us"])
        rows = []
        for calls in (1, 4, 16, 64):
            windows, sums, per_call, enqs = [], [], [], []
            for _ in range(max(5, reps // 4)):
                w, figs, enq, _ = batch(calls)
                windows.append(w)
                sums.append(sum(figs))
                per_call += figs
                enqs.append(enq)
            gaps = sorted(w - s for w, s in zip(windows, sums))
            rows.append({"B": calls, "window_us": med(windows) * 1e6, "sum_events_us": med(sums) * 1e6,
                         "gap_median_us": med(gaps) * 1e6, "gap_max_us": gaps[-1] * 1e6, "gap_min_us": gaps[0] * 1e6,
                         "per_call_us": med(per_call) * 1e6, "enqueue_us": med(enqs) * 1e6})
            say("batch:", rows[-1])
        found["batches"] = rows
        # The hole: a worker that does its 16 calls before the gate and leaves only its events behind it.
        early = [batch(16, early=True) for _ in range(max(5, reps // 4))]
        found["early_16"] = {"window_us": med([w for w, *_ in early]) * 1e6,
                             "sum_events_us": med([sum(f) for _, f, *_ in early]) * 1e6,
                             "enqueue_us": med([e for _, _, e, _ in early]) * 1e6}
        say("16 calls done before the gate (the window sees none of them):", found["early_16"])
        xs = [torch.randn(n, device="cuda") for _ in range(16)]
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(17)]
        local = []
        for _ in range(max(5, reps // 4)):
            flush.zero_()
            torch.cuda.synchronize()
            torch.cuda._sleep(1_000_000)
            evs[0].record()
            for i, x in enumerate(xs):
                x.mul(2.0)
                evs[i + 1].record()
            torch.cuda.synchronize()
            local += [evs[i].elapsed_time(evs[i + 1]) / 1e3 for i in range(16)]
        found["in_process_per_call_us"] = med(local) * 1e6
        say("in-process per call (us):", found["in_process_per_call_us"])
        if not after_step:
            return found
        idle = [batch(1, after=True)[3] for _ in range(10)]
        busy = [batch(1, spin_after=5_000_000, after=True)[3] for _ in range(10)]
        found["own_kernel_after_done_us"] = {"worker_idle": med(idle) * 1e6, "worker_busy": med(busy) * 1e6,
                                             "busy_all": [round(v * 1e6) for v in busy]}
        say("own kernel after done:", found["own_kernel_after_done_us"])
    return found


# ------------------------------------------------------------------ inputs written inside the window


def window_fill(reps: int) -> dict:
    """The design that closes the hole above: the worker enqueues behind the gate on input
    buffers the judging process shared once; inside the window the judging process writes the
    batch's fresh inputs into them from a stream of its own and opens the gate from that stream
    (after the copies), then spins on `done`. The window less this process's own copies (its
    events) against the worker's figures; and the adversary's outputs, computed before the
    window on what the buffers held then, compared with the fresh inputs'."""
    import torch
    import torch.multiprocessing  # noqa: F401 - CUDA tensors through Connection.send as IPC handles

    gate = JudgeWindow.create()
    found: dict = {}
    try:
        opener = WorkerWindow(gate.path, torch)
    except OSError as exc:
        gate.unlink()
        return {"error": f"the judging process's side of the gate: {exc}"}
    proc, conn = _start_child(gate, False)
    with _child_session(proc, conn, found, "inputs inside the window"):
        hello = conn.recv()
        gate.unlink()
        if "error" in hello:
            found["error"] = hello["error"]
            return found
        n, slots_n = 2048 * 4096, 16
        slots = [torch.randn(n, device="cuda") for _ in range(slots_n)]
        fresh = [torch.randn(n, device="cuda") for _ in range(slots_n)]
        flush = torch.empty(128 << 20 >> 2, dtype=torch.int32, device="cuda")
        fill = torch.cuda.Stream()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(fill):   # the copy kernel loaded, the events created, before any gate
            slots[0].copy_(fresh[0])
            e0.record()
            e1.record()
        torch.cuda.synchronize()
        conn.send({"op": "slots", "x": slots})
        conn.recv()

        def fbatch(calls: int, early: bool = False):
            seq = gate.next()
            for f in fresh[:calls]:
                f.normal_()   # values the worker has never seen
            flush.zero_()
            torch.cuda.synchronize()
            conn.send({"op": "fbatch", "seq": seq, "calls": calls, "early": early})
            enq = conn.recv()["enqueue_s"]
            t0 = pc()
            with torch.cuda.stream(fill):
                e0.record()
                for slot, f in zip(slots[:calls], fresh[:calls]):
                    slot.copy_(f)
                e1.record()
                opener.write(OPEN, seq)
            took = wait_word(gate.view, DONE, seq, 5.0)
            t1 = pc()
            if took is None:
                struct.pack_into("<I", gate.view, OPEN, seq)   # whatever held it, never leave it closed
                raise TimeoutError(f"filled batch {seq} ({calls} calls): no done word within 5 s")
            e1.synchronize()
            own = e0.elapsed_time(e1) / 1e3
            conn.send({"op": "fcollect"})
            got = conn.recv()
            right = all(torch.allclose(torch.tensor(sample), (2 * f[:4]).cpu())
                        for sample, f in zip(got["samples"], fresh))
            return t1 - t0, own, got["figures"], enq, right

        alone = {}   # the same fill with no batch behind it: what a calibration would subtract
        for calls in (1, 4, 16):
            owns = []
            for _ in range(max(5, reps // 4)):
                flush.zero_()
                torch.cuda.synchronize()
                with torch.cuda.stream(fill):
                    e0.record()
                    for slot, f in zip(slots[:calls], fresh[:calls]):
                        slot.copy_(f)
                    e1.record()
                e1.synchronize()
                owns.append(e0.elapsed_time(e1) / 1e3)
            alone[calls] = {"median_us": med(owns) * 1e6, "min_us": min(owns) * 1e6, "max_us": max(owns) * 1e6}
        found["fill_alone"] = alone
        say("the fill alone:", alone)
        rows = []
        for calls, early in ((0, False), (1, False), (4, False), (16, False), (16, True)):
            windows, owns, sums, enqs, rights = [], [], [], [], []
            for _ in range(max(5, reps // 4)):
                w, own, figs, enq, right = fbatch(calls, early)
                windows.append(w)
                owns.append(own)
                sums.append(sum(figs))
                enqs.append(enq)
                rights.append(right)
            gaps = sorted(w - o - f for w, o, f in zip(windows, owns, sums))
            rows.append({"B": calls, "early": early, "window_us": med(windows) * 1e6, "own_fill_us": med(owns) * 1e6,
                         "sum_events_us": med(sums) * 1e6, "gap_median_us": med(gaps) * 1e6,
                         "gap_min_us": gaps[0] * 1e6, "gap_max_us": gaps[-1] * 1e6, "enqueue_us": med(enqs) * 1e6,
                         "outputs_right": f"{sum(rights)} of {len(rights)}"})
            say("filled inside the window:", rows[-1])
        found["batches"] = rows
    return found


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        return child(int(sys.argv[2]), sys.argv[3], "--confine" in sys.argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--confine", action="store_true", help="also run the worker in its OS sandbox")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-after", action="store_true",
                        help="skip the step timing this process's own kernel right after `done`")
    args = parser.parse_args()
    results = {"single": single_process()}
    if all(results["single"].get(k) is not None for k in ("registered_current", "registered_side")):
        results["fill"] = window_fill(args.reps)
        results["two"] = [two_processes(False, args.reps, not args.no_after)] + (
            [two_processes(True, args.reps, not args.no_after)] if args.confine else [])
    text = json.dumps(results, indent=1, default=str)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gate_probe.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
