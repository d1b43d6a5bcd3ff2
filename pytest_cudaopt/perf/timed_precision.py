"""The timed calls held to the precision of untimed ones. A worker can tell a timed call from a correctness call (its
frames, grad mode, the calls' pattern), so a candidate could be exact where it is checked and compute less where it is
timed: a loss over a subsample, a lower precision, a stale output that the element-wise tolerance cannot see (a wide
softmax's outputs all lie below atol). Its precision is measured on correctness calls, over enough input sets for a
steady figure; the relative L2 error of its checked timed outputs against the float32 reference, a root mean square
over the calls, may be at most SLACK times that (or the correctness items' on model.py's values, where less and
steady), fp32's edge, or SLACK times torch.compile's own timed error, where larger."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from pytest_cudaopt.correctness.compare import Comparison
from pytest_cudaopt.correctness.precision import EXACT, FP32_FACTOR, FP32_FLOOR, UNKNOWN, Precision

SLACK = 4.0            # how much less precise than measured untimed a timed output may be (input sets differ)


@dataclass(frozen=True)
class Bound:
    """The most a contender's timed outputs may be off the float32 reference (relative L2, RMS over calls), and why."""

    value: float
    why: str


def bound(precision: Precision, tier: str, max_rel_error: float, checked: Sequence[Precision] = (),
          elements: int = 0) -> Bound | None:
    """The timed bound of a contender whose untimed calls measured `precision` and whose tier is `tier` (its own,
    or a less precise one from the correctness items): SLACK times the error measured, at least fp32's edge; None
    for integer/bool outputs (compared exactly). `checked`: what the correctness items measured on model.py's values
    at this shape (the check stage's, under `cudaopt judge`); the least of those steady for outputs of `elements`
    float elements (Precision.steady) counts as measured too, so that a worker that tells the perf stage from the
    check stage gains nothing by computing less in the perf stage's own calls."""
    if EXACT in (tier, precision.tier):
        return None
    found = [(p.candidate_error, p.reference_error, p.tier, "its correctness items measured on model.py's values")
             for p in checked if p.steady(elements) and p.tier not in (EXACT, UNKNOWN)
             and not math.isnan(p.candidate_error) and not math.isnan(p.reference_error)]
    if not (math.isnan(precision.candidate_error) or math.isnan(precision.reference_error)):
        found.append((precision.candidate_error, precision.reference_error, precision.tier,
                      "measured on its untimed calls"))
    if not found:
        return Bound(max_rel_error, f"cudaopt_max_rel_error allows {max_rel_error:.2e} (its precision was not "
                                    f"measured)")
    error, ref, measured_tier, where = min(found)
    # On the same kind of inputs, whatever tier the correctness items gave; within fp32's edge, always. The timed
    # outputs are compared with the float32 reference, itself `ref` off float64.
    value = max(SLACK * error, FP32_FACTOR * ref, FP32_FLOOR) + ref
    return Bound(value, f"the {error:.2e} {where} ({measured_tier}) allows {value:.2e}")


@dataclass
class TimedErrors:
    """Each bounded contender's relative L2 errors of its checked timed outputs against the float32 reference, and
    those of `baseline` (torch.compile in float32): where the timed inputs are worse conditioned than the untimed ones,
    an honest float32 computation drifts from the reference too, and a contender may drift SLACK times as far."""

    bounds: dict[str, Bound]
    baseline: str | None = None
    squares: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, comparison: Comparison) -> None:
        error = comparison.relative_l2
        if (key in self.bounds or key == self.baseline) and error is not None and math.isfinite(error):
            self.squares.setdefault(key, []).append(error * error)

    def error(self, key: str) -> float | None:
        squares = self.squares.get(key)
        return math.sqrt(sum(squares) / len(squares)) if squares else None

    def limit(self, key: str) -> Bound | None:
        """`key`'s bound, raised to SLACK times the baseline's timed error where that is larger."""
        own, drift = self.bounds.get(key), self.error(self.baseline) if self.baseline else None
        if own is None or drift is None or SLACK * drift <= own.value:
            return own
        return Bound(SLACK * drift, f"{SLACK:g}x the {drift:.2e} of {self.baseline}'s timed outputs allows "
                                    f"{SLACK * drift:.2e} ({own.why})")

    def failure(self, key: str) -> str | None:
        """Why `key`'s timed outputs fail their bound, or None."""
        error, limit = self.error(key), self.limit(key)
        if error is None or limit is None or error <= limit.value:
            return None
        return (f"its timed outputs are less precise than its untimed ones: relative L2 error {error:.2e} against the "
                f"float32 reference (root mean square over {len(self.squares[key])} checked timed calls), where "
                f"{limit.why}")

    def to_json(self) -> dict[str, Any]:
        return {key: {"bound": self.limit(key).value, "error": self.error(key), "calls": len(self.squares.get(key, [])),
                      "baseline_error": self.error(self.baseline) if self.baseline else None}
                for key in self.bounds}
