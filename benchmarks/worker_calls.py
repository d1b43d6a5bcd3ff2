"""Where a worker round trip's time goes: ping, the correctness and timed `call`s split into client send / worker receive / the op / worker send / client receive, trivial ops moving 1, 3 and 10 tensors of 4 KB and 4 MB through torch's CUDA IPC and through a prototype CUDA arena, and the in-process call.

    python3 benchmarks/worker_calls.py [--workdir .] [--reps 50] [--out DIR]      # CUDA (default)
    python3 benchmarks/worker_calls.py --device cpu --out DIR                      # CPU smoke (cpu_scale)

The worker is the real one (worker.server.Server, confined as --sandbox says), started by
client.Worker, but through this file (`--serve FD`), which wraps protocol.receive/send, the
pickler's tensor hooks and the ops with perf_counter marks and adds benchmark-only ops (bench_*);
the judging side is wrapped the same way, in this process only. perf_counter is CLOCK_MONOTONIC,
one clock for both processes, so the handoffs between them are measured too. Nothing under
pytest_cudaopt/ is changed. Results: OUT/worker_calls.json and OUT/worker_calls.txt (the tables).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pytest_cudaopt runs from the checkout, uninstalled
    sys.path.insert(0, str(ROOT))

pc = time.perf_counter
ALIGN = 256  # the prototype CUDA arena's alignment
PIECES = ("round_trip", "c_pack", "c_encode", "c_send", "hand_in", "w_unpack", "w_decode", "w_pre", "w_op",
          "w_post", "w_pack", "w_encode", "w_send", "hand_out", "c_unpack", "c_decode")
LEGEND = """pieces (medians, us): round_trip = client's send() start to its receive_bytes() end;
  c_pack  client pickling of the request (c_encode: of it, the tensor hooks: CUDA IPC reduction / arena copy)
  c_send  client send_bytes          hand_in  client send_bytes end -> worker recv_bytes return
  w_unpack worker unpickling (w_decode: of it, tensor rebuilds: cudaIpcOpenMemHandle, event wait / arena views)
  w_pre   worker between rebuild and the op (drops the previous reply, the "drop" list)
  w_op    the op itself (op_call: observe.call_locally or _timed; bench_*: the trivial op)
  w_post  op end -> reply pickling   w_pack / w_encode / w_send  as c_*, for the reply
  hand_out worker send_bytes end -> client recv_bytes return (incl. the client's _relay of the log)
  c_unpack client unpickling of the reply (c_decode: tensor rebuilds)"""


# -------------------------------------------------------------------------------- shared helpers

def _torch():
    return sys.modules["torch"]


def place(buffer, tensors, start: int) -> list:
    """Copy `tensors` into the uint8 CUDA `buffer` from byte `start`: their (offset, dtype, shape)."""
    specs, cursor = [], start
    for t in tensors:
        n = t.numel() * t.element_size()
        cursor = -(-cursor // ALIGN) * ALIGN
        buffer[cursor:cursor + n].view(t.dtype).view(t.shape).copy_(t)
        specs.append((cursor, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        cursor += n
    return specs


def views(buffer, specs) -> list:
    torch = _torch()
    out = []
    for offset, dtype_name, shape in specs:
        dtype = getattr(torch, dtype_name)
        count = 1
        for s in shape:
            count *= s
        n = count * torch.empty((), dtype=dtype).element_size()
        out.append(buffer[offset:offset + n].view(dtype).view(shape))
    return out


def instrument_codec(protocol, enc: list, dec: list) -> None:
    """Time spent in protocol's tensor hooks (the pickler's persistent_id for a tensor: the
    arena copy or torch's reduction; the unpickler's persistent_load: the rebuild)."""
    real_id, real_load = protocol._Packer.persistent_id, protocol._Unpacker.persistent_load

    def persistent_id(self, obj):
        t = pc()
        found = real_id(self, obj)
        if found is not None:
            enc[0] += pc() - t
        return found

    depth = [0]

    def persistent_load(self, pid):
        t = pc()
        depth[0] += 1
        try:
            return real_load(self, pid)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                dec[0] += pc() - t

    protocol._Packer.persistent_id = persistent_id
    protocol._Unpacker.persistent_load = persistent_load


# -------------------------------------------------------------------------------- the worker side

def serve(fd: int) -> int:
    """server.main with marks around receive, the ops and send, and the bench_* ops."""
    import faulthandler
    import signal
    from multiprocessing.connection import Connection

    from pytest_cudaopt import wire as protocol
    from pytest_cudaopt.candidate import serve as server

    records: list[dict] = []
    cur: dict = {}
    enc, dec = [0.0], [0.0]
    instrument_codec(protocol, enc, dec)
    real_receive_bytes = protocol.receive_bytes

    def receive(conn, arena=None, sender="worker"):
        data = conn.recv_bytes()
        cur.clear()
        cur["recv"] = pc()
        dec[0] = 0.0
        message = real_receive_bytes(data, arena, sender)
        cur.update(rebuilt=pc(), decode=dec[0], bytes_in=len(data),
                   op=str(message.get("op")) if isinstance(message, dict) else "?")
        return message

    def send(conn, message, arena=None, writer="judge"):
        s0 = pc()
        enc[0] = 0.0
        buffer = io.BytesIO()
        packer = protocol._Packer(buffer, arena, writer)
        packer.dump(message)
        packed, data = pc(), buffer.getvalue()
        conn.send_bytes(data)
        if cur.get("op") != "bench_stats":
            records.append({**cur, "s0": s0, "packed": packed, "encode": enc[0], "sent": pc(), "bytes_out": len(data)})
        return packer.placed

    protocol.receive, protocol.send = receive, send

    def marked(fn):
        def op(self, request):
            cur["h0"] = pc()
            try:
                return fn(self, request)
            finally:
                cur["h1"] = pc()
        op.__name__ = fn.__name__
        return op

    class BenchServer(server.Server):
        cuda_arena = None
        cuda_half = 0

        def _sync(self):
            if self.torch.cuda.is_initialized():
                self.torch.cuda.synchronize()

        def op_bench_stats(self, request):
            found = list(records)
            records.clear()
            return {"records": found}

        def op_bench_sink(self, request):
            return {"n": len(request["inputs"])}

        def op_bench_echo(self, request):
            output = [t.clone() for t in request["inputs"]]
            self._sync()
            return {"output": output}

        def op_bench_plain(self, request):
            with self.torch.no_grad():
                output = self.models[request["id"]](*request["inputs"])
            self._sync()
            return {"output": output}

        def op_bench_arena_open(self, request):
            self.cuda_arena, self.cuda_half = request["buffer"], int(request["half"])
            return {}

        def op_bench_arena_sink(self, request):
            return {"n": len(views(self.cuda_arena, request["specs"]))}

        def op_bench_arena_echo(self, request):
            output = [t.clone() for t in views(self.cuda_arena, request["specs"])]
            specs = place(self.cuda_arena, output, self.cuda_half)
            self._sync()
            return {"specs": specs}

        def op_bench_arena_plain(self, request):
            with self.torch.no_grad():
                output = self.models[request["id"]](*views(self.cuda_arena, request["specs"]))
            specs = place(self.cuda_arena, [output], self.cuda_half)
            self._sync()
            return {"specs": specs}

    for name in [n for n in dir(BenchServer) if n.startswith("op_") and n != "op_bench_stats"]:
        setattr(BenchServer, name, marked(getattr(BenchServer, name)))

    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    with contextlib.suppress(Exception):
        os.setpgid(0, 0)
    sys.argv = ["cudaopt-worker"]
    return BenchServer(Connection(fd)).serve()


# -------------------------------------------------------------------------------- the judging side

class Probe:
    """Marks of this process's protocol.send / receive_bytes, one entry per request."""

    def __init__(self):
        from pytest_cudaopt import wire as protocol

        self.entries: list[dict] = []
        self.enc, self.dec = [0.0], [0.0]
        instrument_codec(protocol, self.enc, self.dec)
        real_receive_bytes = protocol.receive_bytes

        def send(conn, message, arena=None, writer="judge", on_send=None):
            entry = {"op": str(message.get("op")), "t0": pc()}
            self.enc[0] = 0.0
            buffer = io.BytesIO()
            packer = protocol._Packer(buffer, arena, writer)
            packer.dump(message)
            entry.update(packed=pc(), encode=self.enc[0])
            data = buffer.getvalue()
            if on_send is not None:
                on_send()
            conn.send_bytes(data)
            entry.update(sent=pc(), bytes_out=len(data))
            self.entries.append(entry)
            return packer.placed

        def receive_bytes(data, arena=None, sender="worker"):
            entry = self.entries[-1] if self.entries else {}
            entry["recv"] = pc()
            self.dec[0] = 0.0
            message = real_receive_bytes(data, arena, sender)
            entry.update(rebuilt=pc(), decode=self.dec[0], bytes_in=len(data))
            return message

        protocol.send, protocol.receive_bytes = send, receive_bytes


@contextlib.contextmanager
def through_this_file():
    """Worker.start runs `python -m pytest_cudaopt.candidate FD`: run `this file --serve FD` instead
    (no zygote, which would fork the plain server)."""
    real = subprocess.Popen
    zygote = os.environ.pop("CUDAOPT_WORKER_ZYGOTE", None)

    def popen(args, *rest, **kwargs):
        if isinstance(args, list) and args[1:3] == ["-m", "pytest_cudaopt.candidate"]:
            args = [args[0], str(Path(__file__).resolve()), "--serve", *args[3:]]
        return real(args, *rest, **kwargs)

    subprocess.Popen = popen
    try:
        yield
    finally:
        subprocess.Popen = real
        if zygote is not None:
            os.environ["CUDAOPT_WORKER_ZYGOTE"] = zygote


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def pieces(c: dict, w: dict) -> dict:
    h0, h1 = w.get("h0", w["rebuilt"]), w.get("h1", w["s0"])
    return {"round_trip": c["rebuilt"] - c["t0"], "c_pack": c["packed"] - c["t0"], "c_encode": c["encode"],
            "c_send": c["sent"] - c["packed"], "hand_in": w["recv"] - c["sent"],
            "w_unpack": w["rebuilt"] - w["recv"], "w_decode": w["decode"], "w_pre": h0 - w["rebuilt"],
            "w_op": h1 - h0, "w_post": w["s0"] - h1, "w_pack": w["packed"] - w["s0"], "w_encode": w["encode"],
            "w_send": w["sent"] - w["packed"], "hand_out": c["recv"] - w["sent"],
            "c_unpack": c["rebuilt"] - c["recv"], "c_decode": c["decode"]}


class Bench:
    def __init__(self, worker, probe: Probe, reps: int, meta: dict, out: Path | None):
        self.worker, self.probe, self.reps, self.meta, self.out = worker, probe, reps, meta, out
        self.results: dict[str, dict] = {}

    def dump(self) -> None:
        """The JSON so far (a run cut short keeps the series it finished)."""
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "worker_calls.json").write_text(json.dumps({"meta": self.meta, "results": self.results},
                                                                   indent=1, default=str))

    def stats(self) -> list[dict]:
        return self.worker.request({"op": "bench_stats"}, relay=False)["records"]

    def series(self, name: str, fn, reps: int | None = None) -> dict:
        """`fn(i)` `reps` times (after one untimed warm-up call): medians of what it returns (its
        outer pieces, seconds) and of each request's pieces, grouped by op. An error is kept as
        the series' result and the next series runs."""
        try:
            return self._series(name, fn, reps or self.reps)
        except Exception as exc:  # noqa: BLE001 - one scenario's failure is reported, the rest still run
            self.results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "outer": {}, "ops": {}}
            print(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:500]}", flush=True)
            return self.results[name]
        finally:
            self.dump()

    def _series(self, name: str, fn, reps: int) -> dict:
        fn(-1)  # warm-up (the first IPC handle of a segment, lazy imports)
        self.stats()
        self.probe.entries.clear()
        outer = [fn(i) for i in range(reps)]
        client = [e for e in self.probe.entries if e["op"] != "bench_stats" and "rebuilt" in e]
        worker = self.stats()
        by_op: dict[str, list[dict]] = {}
        paired = len(client) == len(worker) and all(c["op"] == w.get("op") for c, w in zip(client, worker))
        if paired:
            for c, w in zip(client, worker):
                by_op.setdefault(c["op"], []).append(pieces(c, w))
        found = {"reps": reps, "paired": paired,
                 "outer": {k: median([o.get(k) for o in outer]) for k in (outer[0] if outer else {})},
                 "ops": {op: {"per_rep": len(rows) / reps,
                              **{k: median([r[k] for r in rows]) for k in PIECES}} for op, rows in by_op.items()}}
        if not paired:
            found["note"] = f"client saw {len(client)} requests, the worker {len(worker)}: pieces not paired"
        self.results[name] = found
        print(f"  {name}: outer total {_us((found['outer'] or {}).get('total'))} us", flush=True)
        return found


def _us(x) -> str:
    return "-" if x is None else f"{x * 1e6:.1f}"


def cpu_example(dest: Path) -> Path:
    """tests/workdirs/cpu_scale with its shared files, as the tests assemble it."""
    import shutil

    tests = ROOT / "tests" / "workdirs"
    workdir = dest / "cpu_scale"
    (workdir / "kernels").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tests / "_shared" / "model.py", workdir / "model.py")
    shutil.copyfile(tests / "cpu_scale" / "model_new.py", workdir / "model_new.py")
    for name in ("scale.cpp", "scale_binding.cpp"):
        shutil.copyfile(tests / "_shared" / "kernels" / name, workdir / "kernels" / name)
    for name in ("binding.cpp", "binding_registry.h"):
        shutil.copyfile(ROOT / name, workdir / name)
    return workdir


def run(args) -> dict:
    import torch

    from pytest_cudaopt import extension as build
    from pytest_cudaopt.correctness import guards
    from pytest_cudaopt.candidate.observe import OutputHistory, call_locally
    from pytest_cudaopt.correctness.guards import own_outputs
    from pytest_cudaopt.primitives.tensors import clone_inputs, nbytes
    from pytest_cudaopt.workdir import load_reference, load_workdir
    from pytest_cudaopt.remote.worker import Worker

    device = args.device
    cuda = device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    path = Path(args.workdir).resolve() if args.workdir else \
        (ROOT if cuda else cpu_example(Path(tempfile.mkdtemp(prefix="worker-calls-"))))
    t = pc()
    result = build.build(path)
    build_s = pc() - t
    print(f"built {path} in {build_s:.1f}s ({len(result.compiled)} compiled)", flush=True)
    local = load_workdir(path, result.module)
    probe = Probe()
    t = pc()
    with through_this_file():
        worker = Worker(path, result.so_path, device, sandbox=args.sandbox).start()
    start_s = pc() - t
    print(f"worker started in {start_s:.1f}s; sandbox {worker.confined.get('mode')}", flush=True)
    meta = {"workdir": str(path), "device": device, "torch": torch.__version__, "reps": args.reps,
            "build_s": build_s, "worker_start_s": start_s, "sandbox": worker.confined,
            "gpu": torch.cuda.get_device_name() if cuda else None, "calibrated_ping": worker.calibrated_ping}
    bench = Bench(worker, probe, args.reps, meta, args.out)
    try:
        remote_wd = load_reference(path, worker)
        model, inproc = local.make_models(device, seed=1)
        _, remote = remote_wd.make_models(device, seed=1)
        names = guards.input_names(model.forward)
        with worker.sharing():
            inputs = remote_wd.inputs(7, device)
            pool = [remote_wd.inputs(100 + n, device, isolated=True) for n in range(4)]
        with torch.no_grad():
            expected = inproc(*clone_inputs(inputs))
        sync()
        meta.update(input_bytes=nbytes(inputs), output_bytes=nbytes(expected),
                    inputs=[tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)])

        # 1. ping
        def ping(i):
            return {"total": worker.ping()}
        bench.series("ping", ping)

        # 2. the correctness call, as guards._for_candidate + _run_remote make it
        def checked(i):
            sync()
            t0 = pc()
            with worker.sharing():
                mine = clone_inputs(inputs)
            sync()
            t1 = pc()
            reply = remote.checked_call(mine, frozenset(), names)
            t2 = pc()
            owned = own_outputs(reply.get("output"), mine, names)
            sync()
            t3 = pc()
            del reply, owned, mine
            sync()
            t4 = pc()
            return {"clone_inputs": t1 - t0, "request": t2 - t1, "own_outputs": t3 - t2, "release": t4 - t3,
                    "total": t4 - t0}
        bench.series("checked call (correctness)", checked)

        # 2b. what else a correctness case asks the worker: state_dict (twice a case), make + load_state
        def state(i):
            t0 = pc()
            found = remote.state_dict()
            t1 = pc()
            del found
            return {"total": t1 - t0}
        bench.series("state_dict (correctness)", state)

        def make_series(label, loaded):
            def make(i):
                t0 = pc()
                pair = loaded.make_models(device, seed=2)
                sync()
                t1 = pc()
                del pair
                return {"total": t1 - t0}
            bench.series(label, make, reps=max(5, args.reps // 5))
        make_series("make_models (correctness)", remote_wd)

        # 3. the timed call, as perf.clocks times a RemoteModel: a batch of one (RemoteModel.time_batch:
        # the round trip, the judging process's wait for the worker's work, the ping that bounds it)
        def timed(i):
            mine = pool[i % len(pool)]
            sync()
            t0 = pc()
            [(out, seconds)] = remote.time_batch([list(mine)])
            t1 = pc()
            del out
            sync()
            t2 = pc()
            last = remote.clock.batches[-1]
            margin, allowance = last.shift, last.allowance
            return {"request": t1 - t0, "release": t2 - t1, "total": t2 - t0, "worker_seconds": seconds,
                    "margin": margin, "allowance": allowance}
        bench.series("timed call (perf)", timed)

        # 4. the model call alone, through CUDA IPC and through a CUDA arena shared once
        def plain(i):
            mine = pool[i % len(pool)]
            sync()
            t0 = pc()
            reply = worker.request({"op": "bench_plain", "id": remote.key, "inputs": list(mine)}, relay=False)
            t1 = pc()
            del reply
            sync()
            t2 = pc()
            return {"request": t1 - t0, "release": t2 - t1, "total": t2 - t0}
        bench.series(f"plain call, {'IPC' if cuda else 'CPU arena'}", plain)

        micro_sizes = [(n, size) for size in (4 << 10, 4 << 20) for n in (1, 3, 10)]
        buffer = half = None
        if cuda:
            half = max(64 << 20, 2 * max(meta["input_bytes"], meta["output_bytes"]) + (1 << 20), 10 * (4 << 20) + (1 << 20))
            half = -(-half // (2 << 20)) * (2 << 20)
            with worker.sharing():
                buffer = torch.zeros(2 * half, dtype=torch.uint8, device=device)
            sync()
            worker.request({"op": "bench_arena_open", "buffer": buffer, "half": half})

            def arena_plain(i):
                mine = pool[i % len(pool)]
                sync()
                t0 = pc()
                specs = place(buffer, [x for x in mine if isinstance(x, torch.Tensor)], 0)
                sync()
                t1 = pc()
                reply = worker.request({"op": "bench_arena_plain", "id": remote.key, "specs": specs}, relay=False)
                out = views(buffer, reply["specs"])
                t2 = pc()
                del out
                return {"copy_in": t1 - t0, "request": t2 - t1, "total": t2 - t0}
            bench.series("plain call, CUDA arena", arena_plain)

        # 5. trivial ops: n tensors of `size` bytes, to the worker (sink) and back (echo)
        for n, size in micro_sizes:
            with worker.sharing():
                tensors = [torch.randn(size // 4, device=device) for _ in range(n)]
            sync()
            label = f"{n} x {size >> 10} KB" if size < (1 << 20) else f"{n} x {size >> 20} MB"
            for op in ("sink", "echo"):
                def ipc(i, op=op, tensors=tensors):
                    sync()
                    t0 = pc()
                    reply = worker.request({"op": f"bench_{op}", "inputs": tensors}, relay=False)
                    t1 = pc()
                    del reply
                    sync()
                    return {"request": t1 - t0, "total": pc() - t0}
                bench.series(f"{op} {label}, {'IPC' if cuda else 'CPU arena'}", ipc)
                if cuda:
                    def arena(i, op=op, tensors=tensors):
                        sync()
                        t0 = pc()
                        specs = place(buffer, tensors, 0)
                        sync()
                        t1 = pc()
                        reply = worker.request({"op": f"bench_arena_{op}", "specs": specs}, relay=False)
                        if "specs" in reply:
                            views(buffer, reply["specs"])
                        t2 = pc()
                        return {"copy_in": t1 - t0, "request": t2 - t1, "total": t2 - t0}
                    bench.series(f"{op} {label}, CUDA arena", arena)

        # 6. in-process, for comparison
        def local_plain(i):
            mine = pool[i % len(pool)]
            sync()
            t0 = pc()
            with torch.no_grad():
                out = inproc(*mine)
            sync()
            t1 = pc()
            del out
            return {"total": t1 - t0}
        bench.series("in-process plain call", local_plain)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

            def local_events(i):
                mine = pool[i % len(pool)]
                sync()
                start.record()
                with torch.no_grad():
                    out = inproc(*mine)
                end.record()
                sync()
                del out
                return {"total": start.elapsed_time(end) / 1e3}
            bench.series("in-process device time (events)", local_events)

        history = OutputHistory()

        def local_checked(i):
            sync()
            t0 = pc()
            mine = clone_inputs(inputs)
            output, audit, guard = call_locally(inproc, mine, torch.device(device), path, result.module,
                                                frozenset(), history, names)
            sync()
            t1 = pc()
            del output, mine
            return {"total": t1 - t0}
        bench.series("in-process call_locally (correctness)", local_checked)

        make_series("in-process make_models", local)

        # 7. one whole correctness case (guards.run_case: 2 calls, 2 state_dicts, the references)
        def case(remote_side: bool):
            def one(i):
                wd = remote_wd
                t0 = pc()
                ref, cand = wd.make_models(device, seed=3)
                case_inputs = wd.inputs(11, device)
                trial = guards.Trial(model=ref, model_new=cand, model64=None, workdir=path, device=torch.device(device),
                                     atol=1e-2, rtol=1e-2, input_names=names)
                t1 = pc()
                try:
                    guards.run_case(trial, case_inputs)
                except Exception as exc:  # noqa: BLE001 - a failed guard still timed the case's requests
                    print(f"    (case raised {type(exc).__name__}: {getattr(exc, 'check', exc)})", flush=True)
                sync()
                t2 = pc()
                return {"make": t1 - t0, "run_case": t2 - t1, "total": t2 - t0}
            return one
        case_reps = max(3, args.reps // 5)
        bench.series("whole case, worker", case(True), reps=case_reps)  # in-process ModelNew is a test double now
    finally:
        worker.stop()
    return {"meta": meta, "results": bench.results}


def tables(found: dict) -> str:
    meta, results = found["meta"], found["results"]
    meta = {**meta, "sandbox": meta.get("sandbox") or {}}
    lines = [f"{meta['workdir']} on {meta['device']} ({meta.get('gpu') or 'cpu'}), torch {meta['torch']}, "
             f"sandbox {meta['sandbox'].get('mode')}, {meta['reps']} reps; inputs {meta.get('inputs')} "
             f"({meta.get('input_bytes', 0) / 1e6:.1f} MB), output {meta.get('output_bytes', 0) / 1e6:.1f} MB", ""]
    lines.append("outer (medians, us, as the caller sees it):")
    for name, r in results.items():
        lines.append(f"  {name:<40} " + "  ".join(f"{k}={_us(v)}" for k, v in r["outer"].items()))
    lines += ["", LEGEND, ""]
    short = ["round_trip", "c_pack", "c_encode", "c_send", "hand_in", "w_unpack", "w_decode", "w_pre", "w_op",
             "w_post", "w_pack", "w_encode", "w_send", "hand_out", "c_unpack", "c_decode"]
    header = f"  {'scenario / op':<46}{'n':>5}" + "".join(f"{k:>10}" for k in short)
    lines.append(header)
    for name, r in results.items():
        for key in ("note", "error"):
            if r.get(key):
                lines.append(f"  {name:<46}  {key}: {r[key][:200]}")
        for op, p in r["ops"].items():
            lines.append(f"  {(name + ' / ' + op)[:46]:<46}{p['per_rep']:>5.1f}" + "".join(f"{_us(p[k]):>10}" for k in short))
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--serve"]:  # the worker (no torch before the sandbox request)
        return serve(int(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=None, help="default: the repo root on CUDA, cpu_scale on the CPU")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--sandbox", default="auto", help="cudaopt_sandbox mode of the worker (default auto)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    found = run(args)
    text = tables(found)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "worker_calls.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
