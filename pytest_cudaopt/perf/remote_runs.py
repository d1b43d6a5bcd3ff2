"""A worker's ModelNew as a contender of the timing engine: its calls (`RemoteRun`), timed as batches in the worker (`worker.RemoteModel.time_batch`), each contender's consecutive calls of a queued pass one batch."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Sequence

Run = tuple[str, Callable[[], Any], Callable[[], ContextManager]]   # (key, run, scope), as the clocks take them


class RemoteRun:
    """A call of a worker's ModelNew (worker.RemoteModel): the clock times the consecutive
    calls of one contender as a batch in the worker (`RemoteModel.time_batch`), the worker's
    figures checked against this process's clock around it."""

    def __init__(self, remote: Any, args: Sequence[Any], keep: bool = True):
        self.remote, self.args, self.keep = remote, args, keep

    def __call__(self) -> Any:  # untimed (a warm-up, a plain call)
        output = self.remote(*self.args)
        return output if self.keep else None

    def dropped(self) -> "RemoteRun":
        """The same call, its output dropped (an unchecked call of a queued pass)."""
        return RemoteRun(self.remote, self.args, keep=False)


def no_scope() -> ContextManager:
    return nullcontext()


def batches(runs: Sequence[Run]) -> list[list[Run]]:
    """Consecutive runs of one contender: the batches of a queued pass."""
    found: list[list[Run]] = []
    for run in runs:
        if found and found[-1][0][0] == run[0]:
            found[-1].append(run)
        else:
            found.append([run])
    return found


def remote_batches(runs: Sequence[Run]) -> list[list[int]]:
    """The indices of each batch of worker runs (consecutive `RemoteRun`s of one contender)."""
    found: list[list[int]] = []
    for i, (key, run, _) in enumerate(runs):
        if not isinstance(run, RemoteRun):
            continue
        if found and found[-1][-1] == i - 1 and runs[i - 1][0] == key:
            found[-1].append(i)
        else:
            found.append([i])
    return found


def time_remote(runs: Sequence[Run], sample: Callable[[float, Any], Any]) -> list[Any]:
    """One batch of a worker's ModelNew (`RemoteModel.time_batch`): `sample(seconds, output)`
    per run (its output dropped where the run does not keep it), or the exception for every
    run of the batch."""
    remote = runs[0][1].remote
    try:
        with runs[0][2]():
            timed = remote.time_batch([list(run.args) for _, run, _ in runs])
    except Exception as exc:
        return [exc] * len(runs)
    return [sample(seconds, output if run.keep else None) for (_, run, _), (output, seconds) in zip(runs, timed)]
