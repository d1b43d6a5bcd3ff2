"""Test doubles of the judging side's seams: `LocalCandidate`, a ModelNew in this process behind the worker.candidate.Candidate Protocol (what the worker's server does for a RemoteModel, done here); `FakeClock` and `FakeTracer`, scripted times and traces (the perf items' hooks; a generated conftest.py imports them after `DOUBLES_PATH`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Sequence

import torch

from pytest_cudaopt.candidate import observe
from pytest_cudaopt.correctness.faults import context_alive, is_cuda_fault
from pytest_cudaopt.perf.clocks import PerfCounterClock, host_time
from pytest_cudaopt.perf.runs import CandidateCall, Run, Sample
from pytest_cudaopt.perf.trace import Trace
from pytest_cudaopt.workdir import load_state, user_traceback
from pytest_cudaopt.remote.candidate import Candidate, WorkerError

# The head of a generated conftest.py that imports these doubles in a pytest child.
DOUBLES_PATH = f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"


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


class FakeClock(PerfCounterClock):
    """Scripted durations per contender key: `durations[key]` (device time) and `latency[key]`
    (default: the durations) are a number, a sequence cycled or a function called per run; `escaped[key]`
    the latency runs' escape. Virtual time advances by each figure plus `overhead`; the calls are real
    and `calls` lists their keys in order."""

    name = "fake"

    def __init__(self, durations: Mapping[str, Any], *, escaped: Mapping[str, Any] | None = None,
                 latency: Mapping[str, Any] | None = None, default: float | None = None,
                 overhead: float = 0.0, escape_floor: float = 0.0):
        self.durations = {key: _cycle(value) for key, value in durations.items()}
        latency = {**durations, **(latency or {})}
        self.latencies = {key: _cycle(value) for key, value in latency.items()}
        self.escapes = {key: _cycle(value) for key, value in (escaped or {}).items()}
        self.default = default
        self.overhead = overhead
        self.escape_floor = escape_floor
        self.virtual = 0.0
        self.calls: list[str] = []

    def now(self) -> float:
        return self.virtual

    def _next(self, table: Mapping[str, Any], key: str) -> float:
        if key in table:
            return next(table[key])
        if self.default is not None:
            return self.default
        raise KeyError(f"FakeClock has no duration for contender {key!r}")

    def queue(self, runs: Sequence[Run]) -> list[Any]:
        found: list[Any] = []
        for key, run, scope, _ in runs:   # every figure scripted, the candidate's too
            try:
                with scope():
                    output = run()
                    self.calls.append(key)
                    seconds = self._next(self.durations, key)
                    self.virtual += seconds + self.overhead
                    found.append(Sample(seconds=seconds, wall=seconds, escaped=0.0, output=output))
            except Exception as exc:
                found.append(exc)
        return found

    def time(self, key: str, run: Callable[[], Any], call: CandidateCall | None = None) -> Sample:
        output = run()
        self.calls.append(key)
        seconds = self._next(self.latencies, key)
        escaped = next(self.escapes[key]) if key in self.escapes else 0.0
        self.virtual += seconds + escaped + self.overhead
        return Sample(seconds=seconds, wall=seconds + escaped, escaped=escaped, output=output)


def _cycle(value: Any):
    if callable(value):
        while True:
            yield value()
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    while True:
        yield from values


class FakeTracer:
    """Scripted traces per contender key (keys without one get no trace)."""

    def __init__(self, traces: Mapping[str, Trace]):
        self.traces = dict(traces)
        self.calls: list[str] = []

    def trace(self, contender: Any, args: Sequence[Any], *, lead: float = 2e-3) -> Trace | None:
        self.calls.append(contender.key)
        contender.fn(*args)
        return self.traces.get(contender.key)
