"""The element-wise comparison of the candidate's output with the reference's: structure, NaN/Inf, tolerance, the failure table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_cudaopt.correctness.precision import CHUNK
from pytest_cudaopt.primitives.tensors import describe_tensor, leaves, structure

MAX_LISTED = 5  # mismatching elements listed in a failure table


def unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """The index in `shape` of flat position `flat`."""
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _fmt_index(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def _num(x: float) -> str:
    return str(x) if isinstance(x, float) and (math.isnan(x) or math.isinf(x)) else f"{x:.6g}"


@dataclass
class Mismatch:
    index: tuple[int, ...]
    actual: float
    expected: float

    def line(self) -> str:
        return (f"{_fmt_index(self.index):>16}  actual {_num(self.actual):>14}  "
                f"expected {_num(self.expected):>14}  |diff| {_num(abs(self.actual - self.expected))}")


@dataclass
class LeafReport:
    """Errors of one output tensor against the expected one."""

    path: str
    total: int = 0
    mismatched: int = 0
    nan_mismatched: int = 0    # NaN in one and not the other
    inf_mismatched: int = 0    # +-Inf in one where the other has something else
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: Mismatch | None = None  # the element furthest outside (or closest to) the tolerance
    first: list[Mismatch] = field(default_factory=list)
    exact: bool = False            # integer/bool output: compared exactly
    max_expected: float = 0.0      # max |expected| over finite elements (float outputs)
    sq_error: float = 0.0          # sum of (actual - expected)^2 over the finite pairs (float outputs) ...
    sq_expected: float = 0.0       # ... and of expected^2: the relative L2 error's parts
    finite: int = 0

    @property
    def fraction(self) -> float:
        return self.mismatched / self.total if self.total else 0.0


def _nan_max(values) -> float:
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)


@dataclass
class Comparison:
    """The outcome of `compare_outputs`: passed, or the reason and an error table."""

    passed: bool
    atol: float
    rtol: float
    reason: str = ""
    leaves: list[LeafReport] = field(default_factory=list)

    @property
    def max_abs(self) -> float:
        return _nan_max(leaf.max_abs for leaf in self.leaves)

    @property
    def max_rel(self) -> float:
        return _nan_max(leaf.max_rel for leaf in self.leaves)

    @property
    def mismatched(self) -> int:
        return sum(leaf.mismatched for leaf in self.leaves)

    @property
    def nan_mismatched(self) -> int:
        return sum(leaf.nan_mismatched for leaf in self.leaves)

    @property
    def total(self) -> int:
        return sum(leaf.total for leaf in self.leaves)

    @property
    def relative_l2(self) -> float | None:
        """||actual - expected|| / ||expected|| over the finite pairs of every float output (for an all-zero
        expected, the RMS of the error); None without float outputs."""
        floats = [leaf for leaf in self.leaves if not leaf.exact and leaf.finite]
        if not floats:
            return None
        num, den = sum(leaf.sq_error for leaf in floats), sum(leaf.sq_expected for leaf in floats)
        return math.sqrt(num / den) if den > 0 else math.sqrt(num / sum(leaf.finite for leaf in floats))

    @property
    def vacuous(self) -> list[str]:
        """Float outputs for which the element-wise tolerance says nothing: atol >= max|expected|,
        so any output near zero would pass it (the relative L2 bound still applies)."""
        return [leaf.path for leaf in self.leaves
                if not leaf.exact and leaf.total and self.atol > 0 and self.atol >= leaf.max_expected]

    def table(self) -> str:
        """The failure table: per output, the errors, the worst element and the first mismatches."""
        if self.reason and not self.leaves:
            return self.reason
        lines = [self.reason] if self.reason else []
        rule = f"|actual - expected| <= atol + rtol*|expected| (atol={self.atol:g}, rtol={self.rtol:g})"
        for leaf in self.leaves:
            leaf_rule = "exact equality (integer/bool output)" if leaf.exact else rule
            if not leaf.mismatched and not self.passed and len(self.leaves) > 1:
                lines.append(f"{leaf.path}: all {leaf.total} elements within tolerance")
                continue
            pct = 100.0 * leaf.fraction
            lines.append(f"{leaf.path}: {leaf.mismatched} of {leaf.total} elements ({pct:.3g}%) outside {leaf_rule}")
            lines.append(f"  max abs err  {_num(leaf.max_abs)}")
            lines.append(f"  max rel err  {_num(leaf.max_rel)}")
            if leaf.nan_mismatched:
                lines.append(f"  NaN where the other is not: {leaf.nan_mismatched} elements")
            if leaf.inf_mismatched:
                lines.append(f"  Inf where the other differs: {leaf.inf_mismatched} elements")
            if leaf.worst is not None:
                lines.append(f"  worst at {_fmt_index(leaf.worst.index)}: actual {_num(leaf.worst.actual)}, "
                             f"expected {_num(leaf.worst.expected)}")
            if leaf.first:
                lines.append(f"  first {len(leaf.first)} mismatches:")
                lines.extend("  " + m.line() for m in leaf.first)
        return "\n".join(lines)


def _compare_tensor(path: str, actual: torch.Tensor, expected: torch.Tensor,
                    atol: float, rtol: float, allowance: torch.Tensor | None = None) -> LeafReport:
    leaf = LeafReport(path=path, total=expected.numel())
    if not (expected.is_floating_point() or expected.is_complex()):  # integers and bools: no tolerance
        leaf.exact, atol, rtol = True, 0.0, 0.0
    if leaf.total == 0:
        return leaf
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    flat_a, flat_e = actual.detach().reshape(-1), expected.detach().reshape(-1)
    flat_r = None
    if allowance is not None and not leaf.exact and allowance.numel() == flat_e.numel():
        flat_r = allowance.detach().reshape(-1)
    worst_score, worst_at = -1.0, 0
    # In chunks, so that judging a large output needs memory in proportion to a chunk.
    for start in range(0, flat_e.numel(), CHUNK):
        ca, ce = flat_a[start:start + CHUNK], flat_e[start:start + CHUNK]
        a, e = ca.to(torch.float64), ce.to(torch.float64)
        a_nan, e_nan = torch.isnan(a), torch.isnan(e)
        a_inf, e_inf = torch.isinf(a), torch.isinf(e)
        finite = ~(a_nan | e_nan | a_inf | e_inf)
        diff = torch.where(finite, (a - e).abs(), torch.zeros_like(a))
        allowed = atol + rtol * e.abs()
        if flat_r is not None:  # what this element may be off besides (a value family's conditioning)
            allowed = allowed + flat_r[start:start + CHUNK].to(e).nan_to_num(0.0, 0.0, 0.0)
        bad_finite = finite & (diff > allowed)
        if leaf.exact:  # compare in the output's own dtype: float64 cannot hold every int64
            bad_finite = ca != ce
            allowed = torch.ones_like(a)  # the worst element is then the largest difference
        nan_bad = a_nan != e_nan
        inf_bad = (a_inf | e_inf) & ~(a_nan | e_nan) & (a != e)  # an Inf must meet the same Inf; a NaN pair is a match
        bad = bad_finite | nan_bad | inf_bad
        leaf.mismatched += int(bad.sum())
        leaf.nan_mismatched += int(nan_bad.sum())
        leaf.inf_mismatched += int(inf_bad.sum())
        if bool(finite.any()):
            if not leaf.exact:
                leaf.sq_error += float(torch.sum(diff * diff))
                leaf.sq_expected += float(torch.sum(torch.where(finite, e * e, torch.zeros_like(e))))
                leaf.finite += int(finite.sum())
            leaf.max_abs = max(leaf.max_abs, float(diff.max()))
            leaf.max_expected = max(leaf.max_expected, float(torch.where(finite, e.abs(), torch.zeros_like(e)).max()))
            nonzero = finite & (e != 0)
            if bool(nonzero.any()):
                leaf.max_rel = max(leaf.max_rel, float((diff[nonzero] / e[nonzero].abs()).max()))
        # Worst: any non-finite mismatch first, else the largest excess over the tolerance.
        score = torch.where(finite, diff / allowed, torch.zeros_like(a))
        score = torch.where(nan_bad | inf_bad, torch.full_like(a, math.inf), score)
        at = int(torch.argmax(score))
        if float(score[at]) > worst_score:
            worst_score, worst_at = float(score[at]), start + at
        if len(leaf.first) < MAX_LISTED and bool(bad.any()):
            positions = torch.nonzero(bad).reshape(-1)[:MAX_LISTED - len(leaf.first)].tolist()
            leaf.first += [Mismatch(unravel(start + p, expected.shape), float(a[p]), float(e[p])) for p in positions]
    # Like torch.testing: a NaN (or Inf) where the other side differs makes the error NaN (Inf).
    if leaf.nan_mismatched:
        leaf.max_abs = leaf.max_rel = math.nan
    elif leaf.inf_mismatched:
        leaf.max_abs = leaf.max_rel = math.inf
    leaf.worst = Mismatch(unravel(worst_at, expected.shape), float(flat_a[worst_at].to(torch.float64)),
                          float(flat_e[worst_at].to(torch.float64)))
    return leaf


def _layout(t: torch.Tensor) -> tuple[int, ...]:
    """The strides of the dimensions longer than 1 (those of length 1 say nothing)."""
    return tuple(st for size, st in zip(t.shape, t.stride()) if size > 1)


def compare_outputs(actual: Any, expected: Any, *, atol: float = 1e-2, rtol: float = 1e-2,
                    allowance: dict[str, torch.Tensor] | None = None) -> Comparison:
    """Compare the candidate's output with the reference's: same nest, shapes, dtypes, devices, layout, NaN/Inf
    places; every other element within `|a - e| <= atol + rtol*|e|` plus its `allowance` (leaf path -> tensor)."""
    result = Comparison(passed=True, atol=atol, rtol=rtol)
    a_leaves, e_leaves = list(leaves(actual)), list(leaves(expected))

    def fail(reason: str) -> Comparison:
        result.passed, result.reason = False, reason
        return result

    if [p for p, _ in a_leaves] != [p for p, _ in e_leaves]:
        return fail(f"output structure differs: candidate returned {structure(actual)}, "
                    f"reference returned {structure(expected)}")
    for (path, a), (_, e) in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            return fail(f"{path}: candidate returned {structure(a)}, reference returned {structure(e)}")
        if not isinstance(e, torch.Tensor):
            if a != e and not (isinstance(a, float) and isinstance(e, float)
                               and abs(a - e) <= atol + rtol * abs(e)):  # ints: exact
                return fail(f"{path}: candidate returned {a!r}, reference returned {e!r}")
            continue
        for what, got, want in (("shape", tuple(a.shape), tuple(e.shape)), ("dtype", a.dtype, e.dtype),
                                ("device", a.device, e.device)):
            if got != want:
                return fail(f"{path}: {what} differs: candidate {describe_tensor(a)}, reference {describe_tensor(e)}")
        # A contiguous reference output asks for a contiguous one (a CPU worker's outputs come
        # back contiguous, so other layouts are compared by value only).
        if e.is_contiguous() and _layout(a) != _layout(e):
            return fail(f"{path}: strides differ: candidate {tuple(a.stride())}, reference {tuple(e.stride())} "
                        f"(shape {tuple(e.shape)}); the output must have the reference's layout")
        r = (allowance or {}).get(path)
        result.leaves.append(_compare_tensor(path, a, e, atol, rtol, r if isinstance(r, torch.Tensor) else None))
    if result.mismatched:
        result.passed = False
    return result


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(as_bytes(a), as_bytes(b))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as a flat uint8 tensor (a copy when it is not contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[int, tuple[int, ...], float, float]:
    """(elements that differ bitwise, first differing index, value in a, value in b)."""
    if a.numel() == 0:  # nothing to differ (a size-0 dimension)
        return 0, (), 0.0, 0.0
    wa = as_bytes(a).reshape(a.numel(), -1)
    wb = as_bytes(b).reshape(b.numel(), -1)
    differs = (wa != wb).any(dim=1)
    count = int(differs.sum())
    if not count:
        return 0, (), 0.0, 0.0
    flat = int(torch.nonzero(differs)[0])
    fa, fb = a.detach().reshape(-1), b.detach().reshape(-1)
    va, vb = (complex(t[flat]).real if t.is_complex() else float(t[flat]) for t in (fa, fb))
    return count, unravel(flat, a.shape), va, vb
