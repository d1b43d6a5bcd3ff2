"""The speed verdict's decisions: the gate (custom against torch.compile), the regression check, where the figures disagree."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pytest_cudaopt.perf.lineup import COMPILE, CUSTOM, PRECISION_MATCHED, TARGET
from pytest_cudaopt.perf.stats import format_seconds

GATES = {"compile": COMPILE, "precision-matched": PRECISION_MATCHED}
# The three figures of the candidate (device time, latency, summed kernel time) are expected to
# agree within this share; beyond it the notes say so and what it suggests.
FIGURE_MARGIN = 0.15


@dataclass(frozen=True)
class SpeedDecision:
    """`median(custom) <= median(baseline) / min_speedup`, or why it could not be decided."""

    passed: bool
    baseline: str                    # contender key of the baseline
    custom_median: float | None
    baseline_median: float | None
    min_speedup: float
    reason: str = ""                 # why it failed (empty when passed)

    @property
    def speedup(self) -> float | None:
        return self.baseline_median / self.custom_median if self.custom_median and self.baseline_median else None

    @property
    def limit(self) -> float | None:
        """The largest custom median that passes."""
        return None if self.baseline_median is None else self.baseline_median / self.min_speedup

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "baseline": self.baseline, "custom_median_s": self.custom_median,
                "baseline_median_s": self.baseline_median, "min_speedup": self.min_speedup,
                "speedup": self.speedup, "limit_s": self.limit, "reason": self.reason}


def gate_verdict(medians: Mapping[str, float], failures: Mapping[str, str], *,
                 gate: str = "compile", min_speedup: float = 1.05) -> SpeedDecision:
    """Passes iff custom and `gate`'s baseline were timed without failure and custom <= baseline / min_speedup."""
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; expected one of {', '.join(GATES)}")
    baseline = GATES[gate]
    custom_median = _finite(medians.get(CUSTOM))
    baseline_median = _finite(medians.get(baseline))

    def fail(reason: str) -> SpeedDecision:
        return SpeedDecision(False, baseline, custom_median, baseline_median, min_speedup, reason)

    if failures.get(CUSTOM):
        return fail(f"the custom path failed: {failures[CUSTOM]}")
    if custom_median is None:
        return fail("the custom path was not timed")
    if failures.get(baseline):
        return fail(f"the gate's baseline failed: {failures[baseline]}")
    if baseline_median is None:
        return fail(f"the gate's baseline {baseline!r} was not timed")
    if custom_median <= baseline_median / min_speedup:
        return SpeedDecision(True, baseline, custom_median, baseline_median, min_speedup)
    return fail(f"speedup {baseline_median / custom_median:.3f}x is below the required {min_speedup:g}x")


def regression_verdict(medians: Mapping[str, float], *, margin: float) -> dict[str, Any]:
    """Passes iff median(custom) <= median(target) * (1 + margin); {} when either was not timed."""
    custom, target = _finite(medians.get(CUSTOM)), _finite(medians.get(TARGET))
    if custom is None or target is None:
        return {}
    ratio = custom / target
    passed = ratio <= 1 + margin
    note = (f"regression check: median(ModelNew (custom)) / median(ModelNew (target branch)) = "
            f"{format_seconds(custom)} / {format_seconds(target)} = {ratio:.3f} "
            f"{'<=' if passed else '>'} 1 + {margin:g}: {'PASS' if passed else 'FAIL'}")
    return {"passed": passed, "ratio": ratio, "margin": margin, "custom_median_s": custom,
            "target_median_s": target, "note": note}


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) or value <= 0 else float(value)


def figure_warnings(device: float | None, latency: float | None, kernel_sum: float | None,
                    margin: float = FIGURE_MARGIN) -> list[str]:
    """Where device time, latency and summed kernel time of one contender disagree by more than `margin`."""
    out = []
    device, latency = _finite(device), _finite(latency)
    if device and kernel_sum is not None:
        gap = (device - kernel_sum) / device
        if abs(gap) > margin:
            why = ("idle gaps between its kernels, or device work the trace did not attribute to the call"
                   if gap > 0 else "kernels that overlap (several streams), or kernels slower in the profiled call")
            out.append(f"device time {format_seconds(device)} and kernel sum {format_seconds(kernel_sum)} "
                       f"differ by {abs(gap):.0%} (more than {margin:.0%}): {why}")
    if device and latency:
        ratio = latency / device
        if ratio > 1 + margin:
            out.append(f"latency {format_seconds(latency)} is {ratio:.2f}x the device time "
                       f"{format_seconds(device)}: launch-bound (host work between launches), which device "
                       "time does not count (--cudaopt-clock=latency gates on latency)")
        elif ratio < 1 - margin:
            out.append(f"latency {format_seconds(latency)} is below the device time {format_seconds(device)} "
                       f"by {1 - ratio:.0%}: queued calls ran slower than calls from an idle device")
    return out


def candidate_warnings(measurement: Any, kernel_sum: float | None) -> list[str]:
    """`figure_warnings` of the custom path; none on the host clock, where both figures are host time."""
    custom = measurement.results.get(CUSTOM) if measurement is not None else None
    if custom is None or not custom.samples or measurement.clock == "perf-counter":
        return []
    return figure_warnings(custom.device_summary.median, custom.latency_summary.median, kernel_sum)
