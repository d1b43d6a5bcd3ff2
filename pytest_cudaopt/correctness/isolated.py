"""The correctness verdict's side of isolation: torch verified after every candidate call and once more, fully, at the item's end."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pytest_cudaopt.isolation import Breach
from pytest_cudaopt.results import CorrectnessResult

CHECK = "isolation"  # the result's `check` when a change fails the item


def verifier(session, workdir: Path) -> Callable[[str], None]:
    """guards.Trial.verify: every road but the dispatcher's kernels (the slow part, ~0.1 s,
    left to `final`); raises isolation.Breach with the failure."""
    def verify(phase: str) -> None:
        failure = session.isolation.verify(phase, workdir, full=False)
        if failure:
            raise Breach(failure)
    return verify


def failed(result: CorrectnessResult, breach: Breach) -> str:
    """Fail `result` with what `breach` found, and the case it was found on; the message."""
    message = breach.message + (f"\ncase: {breach.case}" if breach.case else "")
    result.passed, result.check, result.message = False, CHECK, message
    return message


def final(result: CorrectnessResult, session, workdir: Path) -> str:
    """Every road, the dispatcher's kernels included, after an item's cases: a change fails
    `result` whatever else it found. Returns the failure, "" when nothing changed (or after a
    CUDA fault: no CUDA call is made then)."""
    if session.fault is not None:
        return ""
    failure = session.isolation.verify("found after the item's calls of ModelNew", workdir)
    if failure:
        result.passed, result.check, result.message = False, CHECK, failure
    return failure
