"""ModelNew as the verdicts call it: the `Candidate` Protocol (worker.RemoteModel implements it; the verdict code in correctness/ and perf/ types against it) and the errors its calls raise; `describe`, its worker's sandbox in one line."""

from __future__ import annotations

from typing import Any, ContextManager, Protocol


class WorkerError(Exception):
    """The worker answered with an error raised by the workdir's code. `kind`: "candidate", "workdir" or "build"."""

    def __init__(self, message: str, kind: str = "candidate", file: str | None = None,
                 fault: bool = False, oom: str | None = None):
        super().__init__(message)
        self.kind, self.file, self.fault, self.oom = kind, file, fault, oom


class WorkerFailed(Exception):
    """The worker died, hung, or sent what is not a reply: nothing it said counts."""

    def __init__(self, headline: str, words: str = ""):
        super().__init__(headline + (f"; its last output:\n{words}" if words else ""))
        self.headline, self.words = headline, words


def describe(facts: dict) -> str:
    """The worker's sandbox facts in one line: which restrictions held and by what, which did not and why."""
    if not facts or facts.get("mode") == "off":
        return "off (cudaopt_sandbox=off): the candidate's worker can reach every file and process of the user's"
    held = ", ".join(f"{name} ({' + '.join(how)})" for name, how in facts.get("held", {}).items())
    line = f"{facts['mode']}: held: {held or 'nothing'}"
    if facts.get("missing"):
        line += "; NOT held: " + "; ".join(f"{name} ({why})" for name, why in facts["missing"].items())
    return line


class Candidate(Protocol):
    """ModelNew, wherever it runs. Every call may raise WorkerError or WorkerFailed."""

    device: str

    def __call__(self, *inputs: Any) -> Any:
        """One call, its output (an untimed warm-up, a precision measurement)."""

    def sharing(self) -> ContextManager:
        """The scope in which this process allocates the tensors it hands the candidate."""

    def checked_call(self, inputs: list, allowed: frozenset[str], names: list[str] | None) -> dict:
        """A correctness call: `output`, `audit` (the ops outside the allow-list), `guard` (or None)."""

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
