"""The inputs of the timed calls: a fresh input set for every call, drawn under its own secret seed outside the timed region, and the expected outputs of the calls that are checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pytest_cudaopt.perf.clocks import host_time
from pytest_cudaopt.perf.runs import CandidateCall
from pytest_cudaopt.primitives.tensors import clone_inputs


@dataclass
class Feed:
    """Where every call's inputs come from: `draw(n)` input set n, `reference(*inputs)` its expected output."""

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
        """The reference's output on a copy of `inputs` (the reference may write into its inputs)."""
        started = host_time()
        try:
            return self.reference(*clone_inputs(inputs))
        finally:
            self.seconds += host_time() - started


@dataclass
class Call:
    """One prepared call: `run()` on input set `index`; a `checked` call's output is compared with `expected`."""

    key: str
    index: int
    run: Callable[[], Any]
    checked: bool = False
    expected: Any = None
    candidate: CandidateCall | None = None
