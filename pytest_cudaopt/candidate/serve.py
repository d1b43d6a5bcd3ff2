"""The worker's side: load the workdir with its extension, construct ModelNew, call it on the inputs it is sent, and hand back outputs and raw observations; nothing here decides a verdict.

The first request is `sandbox`: the worker confines itself and only then imports torch; nothing
else is served before it, so no start path reaches candidate code outside the sandbox."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pytest_cudaopt import wire as protocol
from pytest_cudaopt.candidate import sandbox


class Server:
    def __init__(self, conn: Connection):
        self.torch: Any = None    # imported once the worker is confined (op_sandbox)
        self.sandbox: dict | None = None  # what held (sandbox.confine), after `sandbox`
        self.conn = conn
        self.candidate: Any = None  # model_new.py's module, after `load`
        self.path: Path | None = None
        self.arena: protocol.Arena | None = None
        self.extension = None
        self.models: dict[int, Any] = {}
        self.history = None       # observe.OutputHistory: outputs of earlier calls still alive
        self.kept: Any = None     # the last reply's tensors, alive until the next request
        self.lead = None          # observe.GpuLead: the spin before a timed batch on CUDA
        self.flush: Any = None    # the buffer the kernel trace zeroes to flush L2
        self.events: list = []    # timing events, reused batch to batch
        self.stream_gate = None   # window_page.WorkerWindow, after `gate`
        self.slots: dict = {}     # id -> input sets the judging process shared for gated batches
        self.pending: list = []   # the events of the gated batch whose figures `collect` answers

    def serve(self) -> int:
        while True:
            request = None   # a call's inputs are not held while the next request is awaited (its reply is: `kept`)
            try:
                request = protocol.receive(self.conn, self.arena, "judge")
            except (EOFError, OSError):
                return 0  # the judging process is gone or closed the socket
            self.kept = None
            for key in request.get("drop", ()):
                self.models.pop(key, None)
            op = request.get("op")
            if op == "stop":
                return 0
            handler = getattr(self, "op_" + str(op), None) if self.sandbox is not None or op == "sandbox" else None
            try:
                reply = handler(request) if handler is not None else {"error": f"unknown request {op!r}" if
                                                                      self.sandbox is not None else
                                                                      f"{op!r} before the sandbox request"}
            except BaseException as exc:  # noqa: BLE001 - the candidate's SystemExit too: reported, not obeyed
                reply = self._error(exc, request.get("what", op))
            self.kept = reply
            try:
                protocol.send(self.conn, reply, self.arena, "worker")
            except (OSError, EOFError):
                return 0
            except Exception as exc:  # noqa: BLE001 - an output that cannot be sent (a subclass, a lambda)
                protocol.send(self.conn, {"error": f"the reply to {op} cannot be sent to the judging "
                                                   f"process: {type(exc).__name__}: {exc}"})

    def _error(self, exc: BaseException, what: str) -> dict:
        from pytest_cudaopt.candidate.load import WorkdirError, user_traceback
        from pytest_cudaopt.candidate.observe import context_alive, is_cuda_fault

        if isinstance(exc, WorkdirError):
            return {"error": str(exc), "file": exc.file, "kind": "workdir"}
        roots = [self.path] if self.path is not None else []
        text = f"{what} raised:\n{user_traceback(exc, roots)}" if roots else f"{type(exc).__name__}: {exc}"
        reply = {"error": text + self._refused(exc), "kind": "candidate"}
        if self.torch is None:
            return reply
        if isinstance(exc, self.torch.OutOfMemoryError):
            lines = str(exc).strip().splitlines()
            reply["oom"] = lines[0] if lines else "torch.OutOfMemoryError"
        elif is_cuda_fault(exc) and not context_alive():
            reply["fault"] = True
        return reply

    def _refused(self, exc: BaseException) -> str:
        """What the sandbox says about a refusal among `exc`'s causes ("" for any other error)."""
        seen = exc
        while seen is not None and not (isinstance(seen, PermissionError) or
                                        (isinstance(seen, OSError) and seen.errno in (1, 13))):
            seen = seen.__cause__ or seen.__context__
        if seen is None or not self.sandbox or not self.sandbox.get("held"):
            return ""
        return (f"\n(refused by the worker's OS sandbox, cudaopt_sandbox={self.sandbox['mode']}: the candidate's "
                "process may read only its workdir, its build and the Python and CUDA environment, write only its "
                "scratch folder, and may not start programs (on the CPU, processes), ptrace or signal other processes)")

    def op_sandbox(self, request: dict) -> dict:
        """Confine this process (once), then import torch; on CUDA, make the context: {"sandbox": what held}."""
        if self.sandbox is not None:
            return {"error": "the worker is confined already"}
        device = str(request.get("device") or "cpu")
        self.sandbox = sandbox.confine(str(request["mode"]), str(request["workdir"]), request.get("build"),
                                       str(request["scratch"]), threads_only=not device.startswith("cuda"))
        import torch
        import torch.multiprocessing  # noqa: F401 - the reductions that tensors travel by

        self.torch = torch
        protocol.setup_sharing()
        from pytest_cudaopt.candidate import load, observe  # noqa: F401 - what `load` imports, imported ahead

        if request.get("context", True):   # made now rather than at the gate's request
            self.op_context(request)
        return {"sandbox": self.sandbox}

    def op_context(self, request: dict) -> dict:
        """The CUDA context, made now (a judge's child that launched this worker before its place asks for it)."""
        device = str(request.get("device") or "cpu")
        if device.startswith("cuda") and self.torch.cuda.is_available():
            self.torch.empty(1, device=device)
        return {}

    def op_load(self, request: dict) -> dict:
        """The extension (or MN010's stand-in) and the workdir's two files; whether it is non-deterministic."""
        from pytest_cudaopt.candidate.construct import stand_in_extension
        from pytest_cudaopt.candidate.load import (EXTENSION, WorkdirError, defined_functions, import_candidate,
                                                   import_extension)
        from pytest_cudaopt.candidate.observe import OutputHistory

        if self.sandbox.get("mode") == "require" and "files" in self.sandbox.get("missing", {}):
            return {"error": f"cudaopt_sandbox=require: the worker is not confined ({self.sandbox['missing']['files']})",
                    "kind": "sandbox"}
        path = Path(request["workdir"])
        if request.get("arena"):
            self.arena = protocol.Arena(request["arena"], int(request["arena_bytes"]), create=False)
        if request.get("extension"):
            so = Path(request["extension"])
            try:
                self.extension = import_extension(so, so.parent)
            except ImportError as exc:
                return {"error": f"cudaopt build: {EXTENSION} of {path} was built but does not import: {exc}",
                        "kind": "build"}
        else:
            self.extension = stand_in_extension()
        device = request.get("device", "cpu")
        if device.startswith("cuda") and ":" in device:
            self.torch.cuda.set_device(self.torch.device(device))
        self.path = path
        self.history = OutputHistory()
        functions = defined_functions(self.extension)
        try:
            _, self.candidate = import_candidate(path, self.extension)
        except WorkdirError as exc:  # the policy rules still run (MN010 imports on its own)
            return {"workdir_error": str(exc) + self._refused(exc), "file": exc.file, "functions": functions}
        return {"nondeterministic": bool(getattr(self.candidate, "CUDAOPT_NONDETERMINISTIC", False)),
                "functions": functions}

    def op_extension_call(self, request: dict) -> dict:
        """One function of the extension on the arguments sent (the owner's kernel tests)."""
        output = getattr(self.extension, request["name"])(*request["args"], **request["kwargs"])
        if self.torch.cuda.is_initialized():
            self.torch.cuda.synchronize()
        return {"output": output}

    def op_policy(self, request: dict) -> dict:
        """The facts of MN010 and EX001 (candidate/construct.py)."""
        from pytest_cudaopt.candidate.construct import construction, missing_functions

        return {"construction": construction(self.path, self.extension) if request.get("mn010") else None,
                "missing": missing_functions(self.path, self.extension) if request.get("ex001") else []}

    def op_make(self, request: dict) -> dict:
        """ModelNew(*init) under a private RNG, in eval mode on the device."""
        from pytest_cudaopt.candidate.load import WorkdirError, private_rng, user_traceback

        with private_rng(int(request.get("seed", 0))):
            try:
                model = self.candidate.ModelNew(*list(request["init"]))
            except Exception as exc:
                raise WorkdirError(f"model_new.py: ModelNew(*get_init_inputs()) raised:\n"
                                   f"{user_traceback(exc, [self.path])}", "model_new.py") from exc
        model = model.eval().to(request.get("device", "cpu"))
        key = len(self.models) + 1
        self.models[key] = model
        return {"id": key, "keys": sorted(model.state_dict())}

    def op_load_state(self, request: dict) -> dict:
        from pytest_cudaopt.candidate.load import load_state

        model = self.models[request["id"]]
        load_state(model, request["state"], request.get("buffers") or {}, request.get("model_file", "model.py"))
        return {"state": self._state(model)}

    def op_state(self, request: dict) -> dict:
        return {"state": self._state(self.models[request["id"]])}

    def _state(self, model: Any) -> dict:
        """A copy of ModelNew's state as it is now (a forward that changes it fails)."""
        return {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, self.torch.Tensor)}

    def op_call(self, request: dict) -> dict:
        """One correctness call (observe.call_locally), and ModelNew's state after it."""
        from pytest_cudaopt.candidate.observe import call_locally

        model = self.models[request["id"]]
        inputs = list(request["inputs"])
        device = self.torch.device(request.get("device", "cpu"))
        output, audit, guard = call_locally(model, inputs, device, self.path, self.extension,
                                            frozenset(request.get("allowed", ())), self.history, request.get("names"))
        self.history.add(output)
        return {"output": output, "audit": [op.describe() for op in audit], "guard": guard, "state": self._state(model)}

    def op_time(self, request: dict) -> dict:
        """A timed batch: ModelNew on each input set, back to back behind a spin that gets the host ahead,
        each call's figure the time between its events (on the CPU its wall time)."""
        torch = self.torch
        device = torch.device(request.get("device", "cpu"))
        model = self.models[request["id"]]
        sets = [list(inputs) for inputs in request["inputs"]]
        if device.type != "cuda":
            seconds, outputs = [], []
            with torch.no_grad():
                for inputs in sets:
                    started = time.perf_counter()
                    outputs.append(model(*inputs))
                    seconds.append(time.perf_counter() - started)
            return {"outputs": outputs, "seconds": seconds}
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        events = self._timing_events(len(sets) + 1, stream)
        if self.lead is None:
            from pytest_cudaopt.candidate.observe import GpuLead

            self.lead = GpuLead(device)
        self.lead.enqueue(protocol.LEAD_S)  # the host gets ahead: the events bracket the kernels, not the launches
        outputs, _ = self._chained(model, sets, stream, events)
        torch.cuda.synchronize()
        return {"outputs": outputs, "seconds": self._seconds(events)}

    def _chained(self, model: Any, sets: list[list], stream: Any, events: list) -> tuple[list, list[float]]:
        """ModelNew on each input set, `events` chained through the calls: outputs, host times to enqueue."""
        torch = self.torch
        outputs, enqueued = [], []
        events[0].record(stream)
        with torch.no_grad():
            for inputs, end in zip(sets, events[1:]):
                started = time.perf_counter()
                outputs.append(model(*inputs))
                enqueued.append(time.perf_counter() - started)
                if torch.cuda.current_stream() != stream:
                    torch.cuda.set_stream(stream)
                    raise RuntimeError("ModelNew.forward left a different CUDA stream current after its call; "
                                       "launch on torch.cuda.current_stream() and do not change it")
                end.record(stream)
        return outputs, enqueued

    def op_gate(self, request: dict) -> dict:
        """Map and register the gate's page (before the workdir loads): {} or {"gate_error"}."""
        from pytest_cudaopt.candidate.window_page import WorkerWindow

        torch = self.torch
        try:
            device = torch.device(request.get("device", "cuda"))
            if device.index is not None:
                torch.cuda.set_device(device)
            torch.zeros(1, device=device)
            self.stream_gate = WorkerWindow(str(request["path"]), torch)
        except Exception as exc:  # noqa: BLE001 - no gate here: the judging process times by the round trip
            return {"gate_error": f"{type(exc).__name__}: {exc}"}
        return {}

    def op_slots(self, request: dict) -> dict:
        """The input buffers of gated batches, shared once: one list per call of a batch, a tensor
        where that input is one (filled by the judging process before the gate opens), None elsewhere."""
        while self.slots and len(self.slots) >= int(request.get("keep", 1)):
            self.slots.pop(next(iter(self.slots)))   # the oldest: the judging process dropped it too
        self.slots[request["slots"]] = [list(s) for s in request["sets"]]
        self.torch.cuda.synchronize()
        return {}

    def _timing_events(self, count: int, stream: Any) -> list:
        """`count` timing events, each recorded once before (an event is created at its first
        record, and nothing behind a closed gate may wait on the driver)."""
        while len(self.events) < count:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record(stream)
            self.events.append(event)
        return self.events[:count]

    def op_gated(self, request: dict) -> dict:
        """A gated batch, enqueued: the current stream waits on the gate, runs ModelNew on each slot set
        (`values` where a slot has no tensor) and writes DONE; the reply goes before any of it ran, `collect`
        answers the figures. An empty `inputs` is the gate's calibration: `probe`'s outputs, written behind it."""
        torch = self.torch
        seq = int(request["seq"])
        values = [list(v) for v in request["inputs"]]
        slots = self.slots.get(request.get("slots"), []) if values else []
        if len(slots) < len(values):
            raise RuntimeError("a gated batch on input buffers this worker was not given")
        sets = [[v if s is None else s for s, v in zip(slot, value)] for slot, value in zip(slots, values)]
        model = self.models[request["id"]] if values else None
        probe = dict(request.get("probe") or {}) if not values else {}
        written = [torch.empty(int(probe["bytes"]), dtype=torch.uint8, device="cuda")
                   for _ in range(int(probe.get("count", 1)))] if probe else []
        if written:   # the fill's and the spin's kernels loaded before the gate closes
            written[0][:1].fill_(0)
            torch.cuda._sleep(1)
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        events = self._timing_events(len(sets) + 1, stream)
        self.stream_gate.wait(seq)
        try:
            outputs, enqueued = self._chained(model, sets, stream, events)
            if written:
                if probe.get("cycles"):
                    torch.cuda._sleep(int(probe["cycles"]))
                for tensor in written:
                    tensor.fill_(seq & 0xFF)
                outputs = written
        finally:
            self.stream_gate.done(seq)  # whatever happened: the judging process's spin ends
        self.pending = events
        return {"outputs": outputs, "enqueued": enqueued}

    def op_collect(self, request: dict) -> dict:
        """The figures of the last gated batch, once its work is done."""
        self.torch.cuda.synchronize()
        events, self.pending = self.pending, []
        return {"seconds": self._seconds(events)}

    @staticmethod
    def _seconds(events: list) -> list[float]:
        """Each call's figure: the time between the events before and after it."""
        return [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]

    def op_trace(self, request: dict) -> dict:
        """One call under the profiler behind the lead and the L2 flush: its Chrome-trace events."""
        from pytest_cudaopt.candidate.observe import GpuLead, profiled_call

        torch = self.torch
        device = torch.device(request["device"])
        if self.lead is None or self.lead.device != device:
            self.lead = GpuLead(device)
        size = int(request.get("flush_bytes") or 64 << 20) // 4
        if self.flush is None or self.flush.numel() != size or self.flush.device != device:
            self.flush = torch.empty(size, dtype=torch.int32, device=device)
        events, host_ahead = profiled_call(self.models[request["id"]], list(request["inputs"]), self.lead,
                                           float(request.get("lead", 2e-3)), self.flush)
        return {"events": events, "host_ahead": host_ahead}

    def op_ping(self, request: dict) -> dict:
        return {"t": time.perf_counter()}

    def op_modules(self, request: dict) -> dict:
        """The names of this package's modules loaded in this process, with their files."""
        root = __name__.split(".")[0]
        return {"modules": {name: getattr(module, "__file__", None) for name, module in sorted(sys.modules.items())
                            if name == root or name.startswith(root + ".")}}


def main(argv: list[str]) -> int:
    """Serve on the inherited socket `argv[0]`; SIGUSR1 prints every thread's stack to stderr."""
    fd = int(argv[0])
    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    with contextlib.suppress(Exception):
        os.setpgid(0, 0)
    conn = Connection(fd)
    sys.argv = ["cudaopt-worker"]
    return Server(conn).serve()
