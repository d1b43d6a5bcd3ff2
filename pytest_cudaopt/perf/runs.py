"""What the clocks time: a contender's runs (`Run`), the candidate's calls among them (`CandidateCall`, timed in batches by the candidate: `time_calls`), and a timed run's `Sample`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, NamedTuple, Sequence

from pytest_cudaopt.remote.candidate import Candidate


@dataclass(frozen=True)
class Sample:
    """One timed run: the clock's `seconds`, `wall` to a device-wide synchronise's end, `escaped` after the stream."""

    seconds: float
    wall: float
    escaped: float
    output: Any = None


@dataclass(frozen=True)
class CandidateCall:
    """A call of the candidate: consecutive ones are timed as a batch (`time_calls`); called directly, untimed."""

    candidate: Candidate
    args: Sequence[Any]
    keep: bool = True   # an unchecked call of a queued pass drops its output

    def __call__(self) -> Any:
        output = self.candidate(*self.args)
        return output if self.keep else None

    def dropped(self) -> "CandidateCall":
        return CandidateCall(self.candidate, self.args, keep=False)


class Run(NamedTuple):
    key: str
    run: Callable[[], Any]
    scope: Callable[[], ContextManager]
    call: CandidateCall | None = None   # a candidate's run (`run` is this call)


def batches(runs: Sequence[Run]) -> list[list[Run]]:
    """Consecutive runs of one contender: the batches of a queued pass."""
    found: list[list[Run]] = []
    for run in runs:
        if found and found[-1][0].key == run.key:
            found[-1].append(run)
        else:
            found.append([run])
    return found


def candidate_batches(runs: Sequence[Run]) -> list[list[int]]:
    """The indices of each batch of candidate runs (consecutive runs of one candidate contender)."""
    found: list[list[int]] = []
    for i, run in enumerate(runs):
        if run.call is None:
            continue
        if found and found[-1][-1] == i - 1 and runs[i - 1].key == run.key:
            found[-1].append(i)
        else:
            found.append([i])
    return found


def time_calls(calls: Sequence[CandidateCall]) -> list[Any]:
    """One batch of a candidate's calls: a Sample per call, or the exception for every call of the batch."""
    try:
        timed = calls[0].candidate.time_batch([list(c.args) for c in calls])
    except Exception as exc:
        return [exc] * len(calls)
    return [Sample(seconds=seconds, wall=seconds, escaped=0.0, output=output if c.keep else None)
            for c, (output, seconds) in zip(calls, timed)]
