"""Test doubles of the judging side's seams: `LocalCandidate`, a ModelNew in this process behind the worker.candidate.Candidate Protocol (what the worker's server does for a RemoteModel, done here)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ContextManager

import torch

from pytest_cudaopt.candidate import observe
from pytest_cudaopt.correctness.faults import context_alive, is_cuda_fault
from pytest_cudaopt.perf.clocks import host_time
from pytest_cudaopt.workdir import load_state, user_traceback
from pytest_cudaopt.remote.candidate import Candidate, WorkerError


class LocalCandidate(Candidate):
    """`model` (an nn.Module) judged as ModelNew is: a correctness call under poisoned memory and
    the op audit (observe.call_locally, with this candidate's own output history), its errors as
    the worker reports them (WorkerError with the workdir's traceback lines), timed calls by the
    host clock. Nothing checks its clock (`timing_record` is empty)."""

    def __init__(self, model: torch.nn.Module, *, device: str = "cpu", workdir: Path = Path("."),
                 extension: Any = None):
        self.model = model
        self.device = str(device)
        self.workdir = Path(workdir)
        self.extension = extension
        self.history = observe.OutputHistory()

    def __call__(self, *inputs: Any) -> Any:
        with torch.no_grad():
            return self._raising(lambda: self.model(*inputs))

    def sharing(self) -> ContextManager:
        return contextlib.nullcontext()

    def checked_call(self, inputs: list, allowed: frozenset[str], names: list[str] | None) -> dict:
        output, audit, guard = self._raising(lambda: observe.call_locally(
            self.model, inputs, torch.device(self.device), self.workdir, self.extension, allowed, self.history, names))
        self.history.add(output)
        return {"output": output, "audit": [op.describe() for op in audit], "guard": guard}

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state(self, state: dict, buffers: dict, model_file: str = "model.py") -> None:
        load_state(self.model, state, buffers, model_file)

    def time_batch(self, sets: list[list]) -> list[tuple[Any, float]]:
        found = []
        for inputs in sets:
            started = host_time()
            output = self(*inputs)
            found.append((output, host_time() - started))
        return found

    def trace_events(self, inputs: list, lead: float, flush_bytes: int | None) -> tuple[list, bool]:
        return [], True

    def timing_failure(self) -> str:
        return ""

    def timing_note(self) -> str:
        return ""

    def timing_record(self) -> dict:
        return {}

    def _raising(self, call: Any) -> Any:
        """`call()`; what it raises, as the worker reports the workdir's errors (WorkerError)."""
        try:
            return call()
        except Exception as exc:
            oom = str(exc).strip().splitlines()[0] if isinstance(exc, torch.OutOfMemoryError) else None
            raise WorkerError(f"ModelNew.forward raised:\n{user_traceback(exc, [self.workdir])}", oom=oom,
                              fault=oom is None and is_cuda_fault(exc) and not context_alive()) from exc
