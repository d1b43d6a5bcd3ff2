"""Whose fault a failure is: the candidate's, the environment's or the harness's, and the exit status each gives.

Only the candidate's failures decide a verdict; a failure of the environment or of the harness
leaves the run incomplete, with exit status 75 (run it again) or 70 (a bug of ours)."""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping, Sequence

CANDIDATE, ENVIRONMENT, HARNESS = "candidate", "environment", "harness"
BLAMES = (CANDIDATE, ENVIRONMENT, HARNESS)
EXIT_STATUS = {ENVIRONMENT: 75, HARNESS: 70}   # sysexits.h: EX_TEMPFAIL, EX_SOFTWARE
PROPERTY = "cudaopt_blame"                     # item user property: (PROPERTY, blame)
# The words of failures that no candidate causes: the device busy or gone, a driver that cannot start.
ENVIRONMENT_MARKERS = ("no CUDA device visible", "busy or unavailable", "no CUDA-capable device is detected", "CUDA driver version is insufficient",
                       "forward compatibility was attempted on non supported HW", "cudaErrorDevicesUnavailable",
                       "NVML_ERROR_GPU_IS_LOST", "GPU is lost", "cudaErrorSystemNotReady")
# Exceptions our code raises for the candidate's failures (their names: this module imports none of them).
CANDIDATE_ERRORS = frozenset({"Failed", "WorkerError", "WorkerFailed", "CudaFault", "WorkerCrash", "WorkdirError",
                              "BuildError", "CandidateError", "GuardFailure", "CaseFailed", "Abort", "DoesNotFit"})
NOT_RUN_AFTER_FAULT = "not run: the candidate's earlier CUDA fault"
# torch's out-of-memory message names each process on the device and what it holds; the raising one is "this process".
_HOLDS = re.compile(r"(Process \d+|this process) has ([\d.]+) ([KMGT]i)?B memory in use")
_UNIT = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def environmental(text: str) -> bool:
    """Whether a failure's text names a device or driver that could not run anything."""
    return any(marker in str(text) for marker in ENVIRONMENT_MARKERS)


def classify(exc: BaseException | None, text: str = "") -> str:
    """Whose a failure is, from its exception (None: a failure text alone) and text."""
    if environmental(text) or (exc is not None and environmental(str(exc))):
        return ENVIRONMENT
    cause = _local_out_of_memory(exc)
    if cause is not None:  # this process's own allocation (model.py's get_inputs, say), whatever wraps it
        return out_of_memory(str(cause))
    if exc is None or any(cls.__name__ in CANDIDATE_ERRORS for cls in type(exc).__mro__):
        return CANDIDATE
    return HARNESS


def _local_out_of_memory(exc: BaseException | None) -> BaseException | None:
    """A torch out-of-memory error among `exc`'s causes (as Python shows them): raised in this process, the judging
    one; the candidate's worker's errors arrive as text, never as torch's exception."""
    seen = 0
    while exc is not None and seen < 16:
        if any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__):
            return exc
        exc = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
        seen += 1
    return None


def out_of_memory(text: str) -> str:
    """Whose the device memory was that the judging process could not get (torch's message says who held it): the
    environment's while other processes held more than this one (a shared device, a neighbour's hog: run it again),
    the harness's when this process held the most (our own planning fell short)."""
    holds = [(who == "this process", float(amount) * _UNIT[unit]) for who, amount, unit in _HOLDS.findall(text)]
    own = sum(held for mine, held in holds if mine)
    return HARNESS if own and own >= sum(held for mine, held in holds if not mine) else ENVIRONMENT


def assign(item: Any, blame: str) -> None:
    """Say whose the item's coming failure is."""
    if blame not in BLAMES:
        raise ValueError(f"blame {blame!r} is none of {', '.join(BLAMES)}")
    item.user_properties.append((PROPERTY, blame))


def worst(blames: Iterable[str | None]) -> str | None:
    """The blame that decides a run: the environment's, then the harness's, then the candidate's."""
    found = set(blames)
    return next((b for b in (ENVIRONMENT, HARNESS, CANDIDATE) if b in found), None)


def exit_status(blame: str | None) -> int | None:
    """The exit status a run blamed on `blame` ends with (None: pytest's own)."""
    return EXIT_STATUS.get(blame or "")


def memory_blame(need: int, budget: int, worker_pid: int | None, processes: Sequence[Mapping[str, int]],
                 what: str = "this case", own: bool = False, judge_pid: int | None = None) -> tuple[str, str]:
    """Who holds the device memory a case could not get: (blame, why). `processes` are NVML's ({"pid", "used_bytes"});
    the candidate's worker (`worker_pid`) holding more than the case's `budget` is the candidate's fault, the judging
    process (`judge_pid`, default this one) holding more than the case `need`s and than the other processes is the
    harness's (it kept what earlier cases or items left), anything else the environment's (with the other holders).
    `own`: the candidate's own call ran out; it is the environment's only where other processes hold more than the
    case's budget (else the candidate asked for more than the device has)."""
    from pytest_cudaopt.primitives.memory import gib

    judge_pid = os.getpid() if judge_pid is None else judge_pid
    held = {pid: sum(p["used_bytes"] for p in processes if p["pid"] == pid) for pid in (worker_pid, judge_pid)}
    if worker_pid is not None and held[worker_pid] > budget:
        return CANDIDATE, (f"ModelNew's process (pid {worker_pid}) holds {gib(held[worker_pid])}; {what} allows "
                           f"{gib(budget)}")
    others = sorted((p for p in processes if p["pid"] not in (worker_pid, judge_pid) and p["used_bytes"]),
                    key=lambda p: -p["used_bytes"])
    if held[judge_pid] > max(need, sum(p["used_bytes"] for p in others)):
        return HARNESS, (f"the judging process (pid {judge_pid}) holds {gib(held[judge_pid])}, more than {what} needs "
                         f"({gib(need)}) and more than any other process: its own plan fell short")
    if own and sum(p["used_bytes"] for p in others) <= budget:
        return CANDIDATE, ""
    if not others:  # no process table (no NVML) or no other holder: the machine is short of it
        return ENVIRONMENT, ""
    listed = ", ".join(f"pid {p['pid']} {gib(p['used_bytes'])}" for p in others[:8])
    return ENVIRONMENT, f"other processes hold the device memory {what} needs ({gib(need)}): {listed}"
