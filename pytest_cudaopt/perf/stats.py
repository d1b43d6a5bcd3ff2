"""Statistics of timed runs: quartiles and IQR (from `statistics`), the median's standard error, and times as text."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

# For a normal sample IQR = 1.349 sigma, and the median's standard error is
# sqrt(pi/2) * sigma / sqrt(n) = 1.2533 sigma / sqrt(n). Estimating sigma from the IQR
# keeps one slow outlier run (a preempted host thread) from inflating the error.
IQR_PER_SIGMA = 1.349
MEDIAN_SE_FACTOR = 1.2533


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3), interpolated linearly between order statistics (numpy's default)."""
    if not values:
        raise ValueError("quartiles of no values")
    if len(values) == 1:  # statistics.quantiles needs two points before Python 3.13
        return values[0], values[0], values[0]
    q1, mid, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, mid, q3


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return statistics.median(values)


def iqr(values: Sequence[float]) -> float:
    """Interquartile range, q3 - q1."""
    q1, _, q3 = quartiles(values)
    return q3 - q1


def median_standard_error(values: Sequence[float]) -> float:
    """1.2533 * (IQR / 1.349) / sqrt(n); infinite below two values."""
    n = len(values)
    return MEDIAN_SE_FACTOR * (iqr(values) / IQR_PER_SIGMA) / math.sqrt(n) if n >= 2 else math.inf


def relative_standard_error(values: Sequence[float]) -> float:
    """The median's standard error over the median; infinite when it cannot be estimated."""
    mid = median(values) if len(values) >= 2 else 0.0
    return median_standard_error(values) / mid if mid > 0 else math.inf


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
        q1, mid, q3 = quartiles(values)
        return cls(len(values), mid, q1, q3, q3 - q1, relative_standard_error(values), min(values))


def format_seconds(seconds: float | None) -> str:
    """3 significant digits with a unit: 12.3 us, 4.56 ms, 1.20 s."""
    if seconds is None or (isinstance(seconds, float) and (math.isnan(seconds) or math.isinf(seconds))):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale or unit == "ns":
            value = seconds / scale
            digits = 2 if value < 10 else 1 if value < 100 else 0
            return f"{value:.{digits}f} {unit}"
    return f"{seconds:.3g} s"
