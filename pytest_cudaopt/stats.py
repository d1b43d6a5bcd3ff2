"""Statistics of timed runs: quantiles, median, IQR and the median's standard error (pure functions)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

# For a normal sample IQR = 1.349 sigma, and the median's standard error is
# sqrt(pi/2) * sigma / sqrt(n) = 1.2533 sigma / sqrt(n). Estimating sigma from the IQR
# keeps one slow outlier run (a preempted host thread) from inflating the error.
IQR_PER_SIGMA = 1.349
MEDIAN_SE_FACTOR = 1.2533


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile, linear interpolation between order statistics (numpy's default):
    position h = (n - 1) * q, value v[floor h] + (h - floor h) * (v[floor h + 1] - v[floor h])."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def iqr(values: Sequence[float]) -> float:
    """Interquartile range, quantile(0.75) - quantile(0.25)."""
    return quantile(values, 0.75) - quantile(values, 0.25)


def median_standard_error(values: Sequence[float]) -> float:
    """1.2533 * (IQR / 1.349) / sqrt(n); infinite below two values."""
    n = len(values)
    if n < 2:
        return math.inf
    return MEDIAN_SE_FACTOR * (iqr(values) / IQR_PER_SIGMA) / math.sqrt(n)


def relative_standard_error(values: Sequence[float]) -> float:
    """The median's standard error over the median; infinite when it cannot be estimated."""
    if len(values) < 2:
        return math.inf
    mid = median(values)
    if mid <= 0:
        return math.inf
    return median_standard_error(values) / mid


@dataclass(frozen=True)
class Summary:
    """Median, quartiles, IQR, n and the median's relative standard error of one contender."""

    n: int
    median: float
    q1: float
    q3: float
    iqr: float
    rse: float
    minimum: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Summary":
        if not values:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, math.inf, nan)
        q1, mid, q3 = (quantile(values, q) for q in (0.25, 0.5, 0.75))
        return cls(len(values), mid, q1, q3, q3 - q1, relative_standard_error(values), min(values))
