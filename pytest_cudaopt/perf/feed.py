"""The inputs of the timed calls: a fresh input set for every call, drawn under its own secret seed outside the timed region, and the expected outputs of the calls that are checked.

A memo keyed by input content, by address or by anything else gains nothing when no call ever
sees inputs an earlier call saw: every call of every contender, warm-up included, gets an input
set of its own (`Feed.next`). A CUDA graph needs its inputs at fixed addresses; the engine then
copies each fresh set into the contender's slot in place (`tensors.refill_inputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pytest_cudaopt.perf.clocks import host_time
from pytest_cudaopt.perf.runs import CandidateCall
from pytest_cudaopt.primitives.tensors import clone_inputs


@dataclass
class Feed:
    """Where every call's inputs come from. `draw(n)` returns input set number n (fresh
    tensors; the perf verdict's is get_inputs() under the n-th per-call secret seed), and
    each n is drawn once; `reference(*inputs)` gives the expected output of a set (None:
    no output is checked). `drawn` counts the sets drawn, `seconds` the host time spent
    drawing them and computing expected outputs, all outside the timed region."""

    draw: Callable[[int], Sequence[Any]]
    reference: Callable[..., Any] | None = None
    drawn: int = 0
    seconds: float = 0.0

    def next(self) -> tuple[int, list]:
        """(n, input set n) for the next n: an input set no earlier call has seen."""
        started = host_time()
        index = self.drawn
        inputs = list(self.draw(index))
        self.drawn += 1
        self.seconds += host_time() - started
        return index, inputs

    def expected(self, inputs: Sequence[Any]) -> Any:
        """The reference's output on a copy of `inputs` (the reference may write into its
        inputs; the contender gets the pristine ones)."""
        started = host_time()
        try:
            return self.reference(*clone_inputs(inputs))
        finally:
            self.seconds += host_time() - started


@dataclass
class Call:
    """One prepared call: `run()` calls the contender on input set `index` (the inputs are
    bound in it); a `checked` call's output is compared with `expected`, the reference's;
    `candidate` is the call when the contender is the candidate (`run` is then this call)."""

    key: str
    index: int
    run: Callable[[], Any]
    checked: bool = False
    expected: Any = None
    candidate: CandidateCall | None = None
