"""ModelNew as the verdicts call it: the `Candidate` Protocol (worker.RemoteModel implements it; the verdict code in correctness/ and perf/ types against it) and the errors its calls raise."""

from __future__ import annotations

from typing import Any, ContextManager, Protocol

from pytest_cudaopt.wire import WorkerError, WorkerFailed  # noqa: F401 - what a Candidate's calls raise


class Candidate(Protocol):
    """ModelNew, wherever it runs. Every call may raise WorkerError (the workdir's code raised:
    `fault` a lost CUDA context, `oom` torch's out-of-memory line) or WorkerFailed (its process
    died or hung: nothing it said counts)."""

    device: str

    def __call__(self, *inputs: Any) -> Any:
        """One call, its output (an untimed warm-up, a precision measurement)."""

    def sharing(self) -> ContextManager:
        """The scope in which this process allocates the tensors it hands the candidate."""

    def checked_call(self, inputs: list, allowed: frozenset[str], names: list[str] | None) -> dict:
        """A correctness call: `output`, `audit` (the ops it ran outside the allow-list and
        `allowed`), `guard` ((check, message) of an output that is no fresh tensor, else None)."""

    def state_dict(self) -> dict:
        """ModelNew's parameters and buffers, in this process's memory."""

    def load_state(self, state: dict, buffers: dict, model_file: str = "model.py") -> None:
        """Model's `state` and non-persistent `buffers` into ModelNew, strict."""

    def time_batch(self, sets: list[list]) -> list[tuple[Any, float]]:
        """ModelNew on each input set, back to back: (output, seconds) per set."""

    def trace_events(self, inputs: list, lead: float, flush_bytes: int | None) -> tuple[list, bool]:
        """One profiled call: its Chrome-trace events, and whether the host stayed ahead."""

    def timing_failure(self) -> str:
        """Why the speed verdict cannot rest on this candidate's figures ("" when it can)."""

    def timing_note(self) -> str:
        """What the timing changed or could not do, for the report ("" when nothing)."""

    def timing_record(self) -> dict:
        """The check of the candidate's clock, batch by batch, for the report ({}: no such check)."""
