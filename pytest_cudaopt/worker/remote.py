"""The candidate's objects as the judging process calls them: `RemoteModel` (ModelNew, for the guards, the perf line-up and the trace) and `RemoteExtension` (the built extension, for the owner's kernel tests), each answered by the workdir's worker (client.Worker)."""

from __future__ import annotations

import weakref
from typing import Any

from pytest_cudaopt.tensors import clone_nest
from pytest_cudaopt.worker.client import Worker

# On the CPU, what a loaded host's late wakeups may add to a round trip beyond the handoff: an
# honest call is never raised for the scheduler's milliseconds (the in-process baselines pay no
# wakeup), while a worker that hides tens of milliseconds per call is still timed by this clock.
# The worker runs in a session of its own, which the scheduler's autogroups give a share of its
# own: on a 2-core host under a few busy sessions, an honest 70 us call's round trip was raised
# by up to 10.6 ms (5 ms here failed it at 0.07x).
CPU_WAKEUP_S = 20e-3


class RemoteExtension:
    """The built extension as the owner's own kernel tests call it (the `cuda_extension`
    fixture): `ext.scale(x, w, b)` runs in the worker, on copies of the arguments made in the
    worker's sharing pool; what the function wrote into them is copied back into the
    arguments, and its outputs are copies in this process's memory. A name the extension does
    not define is an AttributeError, as on the module."""

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


class RemoteModel:
    """ModelNew in the worker, as the verdict code calls it: `model(*inputs)` (a timed call:
    outputs as the worker produced them, ordered on this process's stream), `checked_call`
    (a correctness call with the worker's observations), `state_dict`, `load_state_dict`."""

    def __init__(self, worker: Worker, key: int, device: str, keys: list[str]):
        self.worker = worker
        self.key = key
        self.device = device
        self.keys = keys
        self.last_seconds = 0.0
        self.last_io: Any = None  # (inputs, output) of the last timed call, for `vouched`
        weakref.finalize(self, worker.dropped.append, key)
        self.timed_calls = 0
        self.raised: list[float] = []  # by how much `vouched` raised a worker's figure, per call it did

    def eval(self) -> "RemoteModel":
        return self

    def to(self, *args: Any, **kwargs: Any) -> "RemoteModel":
        return self

    def __call__(self, *inputs: Any) -> Any:
        if self.device.startswith("cuda"):
            # The inputs are complete before the worker reads them; no stream of either process
            # waits on the other's (a wait across CUDA contexts holds the GPU for a time slice).
            import torch

            torch.cuda.synchronize()
        reply = self.worker.request({"op": "call", "id": self.key, "inputs": list(inputs), "device": self.device,
                                     "what": "ModelNew.forward"}, what="calling ModelNew", relay=False)
        self.last_seconds = float(reply.get("seconds", 0.0))
        output = reply.get("output")
        self.last_io = (inputs, output)
        # CPU outputs are views of the arena, which the worker's next reply rewrites.
        return clone_nest(output) if not self.device.startswith("cuda") else output

    def vouched(self, outer: float) -> float:
        """The worker's own figure for its last call, as far as this process's wall time
        around the round trip (`outer`) bears it out: never above `outer` (else TimingError),
        and never below `outer` less what a handoff takes now (a ping right after the call,
        `Worker.handoff_bound`): a worker that under-reports (a patched perf_counter, a
        detoured clock_gettime or cudaEventElapsedTime) gains at most the handoff. On the CPU
        the allowance is CPU_WAKEUP_S larger (a loaded host's wakeups); a worker that
        under-reports every call by more than that is timed by this process's clock."""
        from pytest_cudaopt.perf.clocks import TimingError
        from pytest_cudaopt.tensors import nbytes

        seconds = self.last_seconds
        if not 0.0 <= seconds <= outer:
            raise TimingError(f"the worker's figure for a call of ModelNew ({seconds * 1e6:.1f} us) is more than "
                              f"the {outer * 1e6:.1f} us this process measured around it: the candidate's process "
                              "misreported its time")
        inputs, output = self.last_io
        self.last_io = None
        bound = self.worker.handoff_bound(self.worker.ping(), nbytes(list(inputs)) + nbytes(output))
        if not self.device.startswith("cuda"):
            bound += CPU_WAKEUP_S
        self.timed_calls += 1
        if outer - seconds > bound:
            self.raised.append(outer - seconds - bound)
            return outer - bound
        return seconds

    def timing_note(self) -> str:
        """What `vouched` changed, for the report ("" when nothing)."""
        if not self.raised:
            return ""
        most = max(self.raised)
        return (f"on {len(self.raised)} of {self.timed_calls} timed calls the worker's own figure fell short of this "
                f"process's wall time by more than a handoff takes (by up to {most * 1e6:.1f} us): those calls count "
                "the wall time less the handoff")

    def checked_call(self, inputs: list, allowed: frozenset[str], names: list[str] | None) -> dict:
        """A correctness call: the reply's `output`, `audit` (descriptions of ops outside the
        allow-list) and `guard` ((check, message) of an output that is no fresh tensor)."""
        return self.worker.request({"op": "call", "id": self.key, "inputs": list(inputs), "device": self.device,
                                    "check": True,
                                    "allowed": sorted(allowed), "names": names, "what": "ModelNew.forward"},
                                   what="calling ModelNew", copy_back=True)

    def state_dict(self) -> dict:
        return self.worker.request({"op": "state", "id": self.key}, what="reading ModelNew's state")["state"]

    def load_state(self, state: dict, buffers: dict, model_file: str = "model.py") -> None:
        self.worker.request({"op": "load_state", "id": self.key, "state": state, "buffers": buffers,
                             "model_file": model_file}, what="loading Model's state into ModelNew")

    def trace_events(self, inputs: list, lead: float, flush_bytes: int | None) -> tuple[list, bool]:
        reply = self.worker.request({"op": "trace", "id": self.key, "inputs": list(inputs), "device": self.device,
                                     "lead": lead, "flush_bytes": flush_bytes}, what="tracing ModelNew")
        return reply["events"], bool(reply["host_ahead"])
