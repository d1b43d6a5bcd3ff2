"""The candidate's objects as the judging process calls them: `RemoteModel` (ModelNew, for the guards, the perf line-up and the trace) and `RemoteExtension` (the built extension, for the owner's kernel tests), each answered by the workdir's worker (client.Worker)."""

from __future__ import annotations

import weakref
from typing import Any

from pytest_cudaopt.primitives.tensors import clone_nest
from pytest_cudaopt.remote import timing
from pytest_cudaopt.remote.candidate import Candidate
from pytest_cudaopt.remote.worker import Worker, WorkerFailed
from pytest_cudaopt.remote.window import STALL_S

SLOT_SHAPES = 2   # input shapes whose gated buffers are kept at once (a pass's batch, the latency run's call)


class RemoteExtension:
    """The built extension as the `cuda_extension` fixture: each call runs in the worker on copies of the arguments."""

    def __init__(self, worker: Worker):
        self._worker = worker
        self._functions = tuple(worker.facts.get("functions", ()))

    def __dir__(self) -> list[str]:
        return list(self._functions)

    def __repr__(self) -> str:
        return f"<cuda_extension of {self._worker.workdir}, in its worker process>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._functions:
            raise AttributeError(f"cuda_extension of {self._worker.workdir} has no function {name!r} "
                                 f"(it defines: {', '.join(self._functions) or 'nothing'})")

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, args, kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    def _call(self, name: str, args: tuple, kwargs: dict) -> Any:
        import torch

        originals = [*args, *kwargs.values()]
        cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in originals)
        if cuda:
            torch.cuda.synchronize()
            with self._worker.sharing():  # no segment the worker maps holds anything else of ours
                args, kwargs = clone_nest(list(args)), {k: clone_nest(v) for k, v in kwargs.items()}
            torch.cuda.synchronize()
        reply = self._worker.request({"op": "extension_call", "name": name, "args": list(args), "kwargs": kwargs},
                                     what=f"calling cuda_extension.{name}", copy_back=True)
        if cuda:
            for original, sent in zip(originals, [*args, *kwargs.values()]):
                if isinstance(original, torch.Tensor) and original is not sent:
                    original.copy_(sent)
        return clone_nest(reply.get("output"))


class RemoteModel(Candidate):
    """ModelNew in the worker, as the verdict code calls it (candidate.Candidate)."""

    def __init__(self, worker: Worker, key: int, device: str, keys: list[str]):
        self.worker = worker
        self.key = key
        self.device = device
        self.keys = keys
        weakref.finalize(self, worker.dropped.append, key)
        self.clock = timing.ClockAudit()   # every timed batch, and what they say of the worker's clock
        self.gated = 0        # timed batches behind the gate (remote/window.py); the others went by the round trip
        self.gate_off = ""    # why this model's batches no longer go behind the gate
        self.gate_calls = 0   # the most calls a gated batch of this model may hold (0: the clock's batch)
        self.gate_note = ""   # why it is not 0
        self._warm: set = set()   # input signatures timed once by the round trip (kernels loaded, blocks cached)
        self._gated_io: dict = {}  # the gated path's input buffers by shape: (id, sets), shared with the worker once
        self._slot_ids = 0
        self.windows: list[tuple[int, float, float]] = []  # per gated batch: (calls, opening to DONE, copy excess)
        self._state: dict | None = None   # ModelNew's state as the last request that could change it carried it

    def __call__(self, *inputs: Any) -> Any:
        return self.time_batch([list(inputs)])[0][0]

    def time_batch(self, sets: list[list]) -> list[tuple[Any, float]]:
        """ModelNew on each input set, back to back in the worker: (output, seconds) per set. On a GPU
        behind the gate once the same shapes ran by the round trip, else by the round trip one call at a time."""
        self._state = None   # a forward that changes ModelNew's state: read again when asked
        if not self.device.startswith("cuda"):
            return self._time_round_trip(sets)
        found: list[tuple[Any, float]] = []
        while len(found) < len(sets):
            part = sets[len(found):len(found) + (self.gate_calls or len(sets))]
            timed = self._time_gated(part) if self._gate_ready(part) else None
            found += timed if timed is not None else self._time_round_trip(part[:1])
        return found

    def _time_round_trip(self, sets: list[list]) -> list[tuple[Any, float]]:
        """ModelNew on each input set, its figures checked against the round trip (on the CPU, its CPU time too)."""
        from pytest_cudaopt.perf.clocks import host_time
        from pytest_cudaopt.primitives.tensors import count_tensors, nbytes

        worker = self.worker
        cuda = self.device.startswith("cuda")
        if cuda:
            # The inputs are complete before the worker reads them; no stream of either process
            # waits on the other's (a wait across CUDA contexts holds the GPU for a time slice).
            import torch

            torch.cuda.synchronize()
        request = {"op": "time", "id": self.key, "inputs": [list(s) for s in sets], "device": self.device,
                   "what": "ModelNew.forward"}
        sent: list[float] = []
        # The worker's CPU time from before the inputs go into the arena (a watching thread counts too).
        cpu_before = None if cuda else worker.cpu_seconds()
        reply = worker.request(request, what="timing ModelNew", relay=False, on_send=lambda: sent.append(host_time()))
        cpu_after = None if cuda else worker.cpu_seconds()
        if cuda:
            # The outputs' rebuild made this stream wait on the worker's calling stream: a worker that
            # answers before its kernels finish is timed to their end (docs/threat-model.md).
            torch.cuda.synchronize()
        outer = host_time() - sent[0]
        outputs = _outputs(reply, len(sets), "batch")
        ping = worker.ping()
        if cuda:  # handles cross, not bytes
            handles = count_tensors(sets) + count_tensors(outputs)
            bounds = [timing.Bound(outer, 0.0, worker.handoff_bound(ping, handles=handles))]
        else:  # the inputs were copied into the arena before the clock started; the worker views them there
            copied = nbytes(outputs)
            handoff = worker.handoff_bound(ping, copied=copied)
            bounds = [timing.Bound(outer, 0.0, handoff + timing.CPU_WAKEUP_S)]
            if cpu_before is not None and cpu_after is not None:
                # Its CPU time (no wakeups), never more than the round trip (a kernel's threads add up faster).
                bounds.append(timing.Bound(min(cpu_after - cpu_before, outer), 0.0,
                                           min(handoff, timing.CPU_HANDOFF_S + copied / 1e9)
                                           + len(sets) * timing.CPU_CALL_S))
        seconds = self.clock.add(timing.credit(_figures(reply, len(sets)), bounds, gated=False))
        # CPU outputs are views of the arena, which the worker's next reply rewrites.
        return [(clone_nest(o) if not cuda else o, t) for o, t in zip(outputs, seconds)]

    def _gate_ready(self, sets: list[list]) -> bool:
        """Whether this batch goes behind the gate: flat contiguous CUDA inputs, shapes warmed by the round trip."""
        import torch

        if self.worker.stream_gate is None or self.gate_off:
            return False
        for inputs in sets:
            tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
            if any(isinstance(x, (list, tuple, dict)) for x in inputs) or any(
                    not (x.is_cuda and x.is_contiguous()) or x.requires_grad or x.is_sparse for x in tensors) \
                    or len({x.untyped_storage().data_ptr() for x in tensors}) < len(tensors):
                return False
        key = _shapes(sets)
        if key in self._warm:
            return True
        self._warm.add(key)
        return False

    def _slots(self, sets: list[list]) -> tuple[int, list[list]]:
        """The input buffers of batches of this shape, shared with the worker once (filled after its enqueue)."""
        import torch

        key = _shapes(sets)
        io = self._gated_io
        if key not in io:
            while len(io) >= SLOT_SHAPES:
                io.pop(next(iter(io)))
            with self.worker.sharing():
                slots = [[torch.empty(x.shape, dtype=x.dtype, device=x.device) if isinstance(x, torch.Tensor)
                          else None for x in inputs] for inputs in sets]
            torch.cuda.synchronize()
            self._slot_ids += 1
            self.worker.request({"op": "slots", "slots": self._slot_ids, "sets": slots, "keep": SLOT_SHAPES},
                                what="receiving the gated batches' inputs", relay=False)
            io[key] = (self._slot_ids, slots)
        return io[key]

    def _time_gated(self, sets: list[list]) -> list[tuple[Any, float]] | None:
        """The batch behind the gate: the worker enqueues it, then this process writes the inputs, flushes L2,
        opens the gate, spins on DONE and copies every output out. None when the enqueue stalled (`_stalled`)."""
        import torch
        from pytest_cudaopt.perf.clocks import host_time
        from pytest_cudaopt.primitives.tensors import leaves

        worker, gate = self.worker, self.worker.stream_gate
        work = gate.work
        torch.cuda.synchronize()
        sid, slots = self._slots(sets)
        values = [[None if isinstance(x, torch.Tensor) else x for x in inputs] for inputs in sets]
        seq = gate.next()
        stalled: list[float] = []
        try:
            reply = worker.request({"op": "gated", "id": self.key, "seq": seq, "slots": sid, "inputs": values,
                                    "what": "ModelNew.forward"}, what="timing ModelNew behind the gate", relay=False,
                                   stall=(STALL_S, lambda: stalled.append(gate.open(seq))), sync_events=False)
            if stalled:
                self._stalled(len(sets), [float(x) for x in reply.get("enqueued", ())])
                del reply
                worker.request({"op": "collect"}, what="timing ModelNew behind the gate", relay=False)
                return None
            outputs = _outputs(reply, len(sets), "gated batch")
            copies = [_empty_like(o) for o in outputs]
            pairs = [(d, o) for c, out in zip(copies, outputs) for (_, d), (_, o) in zip(leaves(c), leaves(out))
                     if isinstance(d, torch.Tensor)]
            work.fill([(slot, x) for slot_set, inputs in zip(slots, sets) for slot, x in zip(slot_set, inputs)
                       if slot is not None])
            opened = gate.open(seq)
            try:
                seen = gate.wait_done(seq, worker.alive)
            except ChildProcessError:
                raise WorkerFailed("the candidate's worker process ended inside a gated batch of ModelNew",
                                   worker.last_words()) from None
            except TimeoutError as exc:
                raise WorkerFailed(f"ModelNew's timed batch: {exc}") from None
            excess, copy_s = work.excess(seen, pairs)
        finally:
            gate.open(seq)   # never left closed: the worker's stream would wait on it for ever
        seconds = worker.request({"op": "collect"}, what="timing ModelNew behind the gate", relay=False)
        collected = host_time()
        # The worker's blocks, its to reuse, released once the collect's clock stopped: closing a
        # CUDA IPC handle waits on the device (16 of them added ~500 us to the collect's interval).
        del reply, outputs, pairs
        self.windows.append((len(sets), seen - opened, excess))
        # The collect's round trip waits for the worker's whole device: work on another of its streams,
        # past DONE, is counted there less a handoff (the calibrated ping's: before any workdir code).
        ping = worker.calibrated_ping or worker.ping()
        extra = gate.extra(seen - opened)   # a longer batch's copy out costs more (window.SPUN_S)
        calls = len(sets)
        seconds = _figures(seconds, calls)
        bounds = [timing.Bound(seen - opened + excess, gate.median + extra + calls * timing.HONEST_CALL_S,
                               gate.fixed + extra + timing.MARGIN_S + calls * timing.CALL_MARGIN_S),
                  timing.Bound(collected - opened - copy_s, gate.median + extra,
                               gate.fixed + extra + worker.handoff_bound(ping))]
        seconds = self.clock.add(timing.credit(seconds, bounds, gated=True))
        self.gated += 1
        return list(zip(copies, seconds))

    def _stalled(self, calls: int, enqueued: list[float]) -> None:
        """A gated batch whose enqueue stalled: later batches hold fewer calls, or go by the round trip."""
        waited = max(range(len(enqueued)), key=enqueued.__getitem__) if len(enqueued) == calls else 0
        if waited > 0 and enqueued[waited] >= STALL_S / 2:   # that call did wait, not the answer after it
            self.gate_calls = waited
            self.gate_note = (f"behind the gate at most {waited} calls a batch: a batch of {calls} did not return "
                              f"within {STALL_S:g} s, its call {waited + 1} waiting (more launches than CUDA queues "
                              "on a stream that waits)")
            return
        self.gate_off = (f"ModelNew.forward did not return within {STALL_S:g} s behind the gate (it waits "
                         "for the device, as a synchronise, .item() or an allocation from the driver does, "
                         "or it launches more kernels than CUDA queues on a stream that waits)")

    def timing_failure(self) -> str:
        """Why the speed verdict cannot rest on this model's figures ("" when it can)."""
        return self.clock.failure() or self.clock.unresolved(self.device)

    def timing_note(self) -> str:
        """What the timing changed or could not do, for the report ("" when nothing)."""
        from pytest_cudaopt.perf.stats import median

        notes = []
        raised = self.clock.raised()
        own = median([f for b in self.clock.batches for f in b.figures] or [0.0])
        counted = median([c for b in self.clock.batches for c in b.counted] or [0.0])
        if raised and counted > 1.01 * own and not self.clock.failure():
            # An honest batch now and then runs past its allowance (a late wakeup, a slow context
            # switch): counted at the judging process's time less the allowance, and said.
            notes.append(f"{len(raised)} of {self.clock.timed_calls} timed calls took longer by the judging process's clock "
                         f"than ModelNew's own timer said, past the allowance for timing noise: those count the "
                         f"judging process's time less that allowance (up to {max(raised) * 1e6:.1f} us more a call)")
        off = self.gate_off
        if not off and self.device.startswith("cuda") and self.clock.timed_calls and self.worker.stream_gate is None:
            off = f"the worker has no gate ({self.worker.stream_gate_error or 'none set up'})"
        if off:
            notes.append(f"timed by the round trip, not behind the gate: {off}")
        elif self.gate_note:
            notes.append(self.gate_note)
        return "; ".join(notes)

    def timing_record(self) -> dict:
        return self.clock.to_json()

    def sharing(self):
        """The worker's sharing pool: the segments it maps hold nothing else of this process's."""
        return self.worker.sharing()

    def checked_call(self, inputs: list, allowed: frozenset[str], names: list[str] | None) -> dict:
        """A correctness call: the reply's `output`, `audit` and `guard` (candidate.Candidate)."""
        self._state = None
        reply = self.worker.request({"op": "call", "id": self.key, "inputs": list(inputs), "device": self.device,
                                     "check": True,
                                     "allowed": sorted(allowed), "names": names, "what": "ModelNew.forward"},
                                    what="calling ModelNew", copy_back=True)
        self._state = reply.pop("state", None)
        return reply

    def state_dict(self) -> dict:
        """ModelNew's state as the last request that could change it carried it, else read now."""
        if self._state is None:
            self._state = self.worker.request({"op": "state", "id": self.key}, what="reading ModelNew's state")["state"]
        return self._state

    def load_state(self, state: dict, buffers: dict, model_file: str = "model.py") -> None:
        self._state = None
        reply = self.worker.request({"op": "load_state", "id": self.key, "state": state, "buffers": buffers,
                                     "model_file": model_file}, what="loading Model's state into ModelNew")
        self._state = reply.get("state")

    def trace_events(self, inputs: list, lead: float, flush_bytes: int | None) -> tuple[list, bool]:
        reply = self.worker.request({"op": "trace", "id": self.key, "inputs": list(inputs), "device": self.device,
                                     "lead": lead, "flush_bytes": flush_bytes}, what="tracing ModelNew")
        return reply["events"], bool(reply["host_ahead"])


def _outputs(reply: dict, calls: int, batch: str) -> list:
    outputs = list(reply.get("outputs") or [])
    if len(outputs) != calls:
        raise WorkerFailed(f"the candidate's worker process answered {len(outputs)} outputs for a {batch} of "
                           f"{calls} timed calls")
    return outputs


def _figures(reply: dict, calls: int) -> list[float]:
    seconds = [float(x) for x in reply.get("seconds", ())]
    if len(seconds) != calls:
        raise timing.TimingError(f"the candidate's process answered {len(seconds)} figures for {calls} "
                                 "timed calls of ModelNew")
    return seconds


def _shapes(sets: list[list]) -> tuple:
    """A batch's shapes, dtypes and devices: the key of its warm-up and of its shared input buffers."""
    import torch

    return tuple(tuple((tuple(x.shape), x.dtype, str(x.device)) if isinstance(x, torch.Tensor) else None
                       for x in inputs) for inputs in sets)


def _empty_like(value: Any) -> Any:
    """A nest like `value`, each tensor a new one of this process's (allocated before a window)."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.empty_like(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_empty_like(v) for v in value)
    return value
