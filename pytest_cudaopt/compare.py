"""The correctness verdict's arithmetic: output structure, NaN/Inf, tolerance, error tables, precision tier.

About 550 lines: the element-wise comparison and the precision against float64 both produce
the one table a failure prints (CorrectnessResult); they are kept beside the table they fill."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from pytest_cudaopt.contenders import FP32, HALF_LIKE, TF32_LIKE, UNKNOWN  # noqa: F401 (UNKNOWN: compare.UNKNOWN)

# Precision tiers (names in contenders.py), from the candidate's relative L2 error against a
# float64 run of the reference (see `precision_tier`). Float32 rounding leaves ~1e-7..1e-6; a
# 10-bit mantissa (TF32 tensor cores, fp16 storage) ~3e-4..6e-4; an 8-bit one (bf16) ~2e-3..4e-3.
# EXACT: integer/bool outputs compared bit for bit; WRONG: a float output whose relative L2 error
# against float64 exceeds cudaopt_max_rel_error (whatever the element-wise tolerance said).
EXACT, WRONG = "exact", "wrong"
FP32_FACTOR = 10.0     # within 10x the float32 reference's own error ...
FP32_FLOOR = 1e-5      # ... or below this, whichever is larger: fp32
TF32_LIMIT = 1e-3      # up to this: tf32-like; above it: half-like
TIER_ORDER = (EXACT, FP32, TF32_LIKE, HALF_LIKE, WRONG)

MAX_LISTED = 5  # mismatching elements listed in a failure table


def leaves(value: Any, path: str = "output") -> Iterator[tuple[str, Any]]:
    """(path, leaf) for every leaf of a nest of tuples, lists and dicts: `output[1]['y']`."""
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}[{key!r}]")
    else:
        yield path, value


def structure(value: Any) -> str:
    """A short description of a nest: `tuple(Tensor float32[3, 4], int)`."""
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({', '.join(structure(v) for v in value)})"
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k!r}: {structure(v)}" for k, v in value.items()) + ")"
    if isinstance(value, torch.Tensor):
        return f"{type(value).__name__} {describe_tensor(value)}"
    return type(value).__name__


def describe_tensor(t: torch.Tensor) -> str:
    """`float32[16, 256] on cpu`."""
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{dtype}[{', '.join(str(s) for s in t.shape)}] on {t.device}"


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _fmt_index(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def _num(x: float) -> str:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.6g}"


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

    @property
    def fraction(self) -> float:
        return self.mismatched / self.total if self.total else 0.0


def _nan_max(values) -> float:
    values = list(values)
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=0.0)


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
    def vacuous(self) -> list[str]:
        """Float outputs for which the element-wise tolerance says nothing: atol >= max|expected|,
        so any output near zero would pass it (the relative L2 bound still applies)."""
        return [leaf.path for leaf in self.leaves
                if not leaf.exact and leaf.total and self.atol > 0 and self.atol >= leaf.max_expected]

    @property
    def exact(self) -> bool:
        """Every tensor output is an integer/bool one (compared exactly)."""
        return bool(self.leaves) and all(leaf.exact for leaf in self.leaves)

    def table(self) -> str:
        """The failure table: max abs/rel error, worst index with both values, fraction
        mismatched, the first few mismatching elements."""
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
            lines.append(f"{leaf.path}: {leaf.mismatched} of {leaf.total} elements ({pct:.3g}%) "
                         f"outside {leaf_rule}")
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


CHUNK = 1 << 24  # elements compared at a time: the float64 temporaries stay ~128 MiB each


def _compare_tensor(path: str, actual: torch.Tensor, expected: torch.Tensor,
                    atol: float, rtol: float, max_listed: int) -> LeafReport:
    leaf = LeafReport(path=path, total=expected.numel())
    if not (expected.is_floating_point() or expected.is_complex()):
        # Integers and bools: a float tolerance never applies.
        leaf.exact, atol, rtol = True, 0.0, 0.0
    if leaf.total == 0:
        return leaf
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    flat_a, flat_e = actual.detach().reshape(-1), expected.detach().reshape(-1)
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
        bad_finite = finite & (diff > allowed)
        if leaf.exact:  # compare in the output's own dtype: float64 cannot hold every int64
            bad_finite = ca != ce
            allowed = torch.ones_like(a)  # the worst element is then the largest difference
        nan_bad = a_nan != e_nan
        # An Inf must meet the same Inf; a NaN pair is a match.
        inf_bad = (a_inf | e_inf) & ~(a_nan | e_nan) & (a != e)
        bad = bad_finite | nan_bad | inf_bad
        leaf.mismatched += int(bad.sum())
        leaf.nan_mismatched += int(nan_bad.sum())
        leaf.inf_mismatched += int(inf_bad.sum())
        if bool(finite.any()):
            leaf.max_abs = max(leaf.max_abs, float(diff.max()))
            leaf.max_expected = max(leaf.max_expected,
                                    float(torch.where(finite, e.abs(), torch.zeros_like(e)).max()))
            nonzero = finite & (e != 0)
            if bool(nonzero.any()):
                leaf.max_rel = max(leaf.max_rel, float((diff[nonzero] / e[nonzero].abs()).max()))
        # Worst: any non-finite mismatch first, else the largest excess over the tolerance.
        score = torch.where(finite, diff / allowed, torch.zeros_like(a))
        score = torch.where(nan_bad | inf_bad, torch.full_like(a, math.inf), score)
        at = int(torch.argmax(score))
        if float(score[at]) > worst_score:
            worst_score, worst_at = float(score[at]), start + at
        if len(leaf.first) < max_listed and bool(bad.any()):
            positions = torch.nonzero(bad).reshape(-1)[:max_listed - len(leaf.first)].tolist()
            leaf.first += [Mismatch(_index(start + p, expected.shape), float(a[p]), float(e[p]))
                           for p in positions]
    # Like torch.testing: a NaN (or Inf) where the other side differs makes the error NaN (Inf).
    if leaf.nan_mismatched:
        leaf.max_abs = leaf.max_rel = math.nan
    elif leaf.inf_mismatched:
        leaf.max_abs = leaf.max_rel = math.inf
    leaf.worst = Mismatch(_index(worst_at, expected.shape), float(flat_a[worst_at].to(torch.float64)),
                          float(flat_e[worst_at].to(torch.float64)))
    return leaf


def compare_outputs(actual: Any, expected: Any, *, atol: float = 1e-2, rtol: float = 1e-2,
                    max_listed: int = MAX_LISTED) -> Comparison:
    """Compare the candidate's output with the reference's: the same nest of tuples/lists/
    dicts, tensors with the same shape, dtype and device, NaN and Inf in the same places,
    every other element within `|a - e| <= atol + rtol*|e|`. Never raises for a mismatch."""
    result = Comparison(passed=True, atol=atol, rtol=rtol)
    a_leaves, e_leaves = list(leaves(actual)), list(leaves(expected))
    if [p for p, _ in a_leaves] != [p for p, _ in e_leaves]:
        result.passed = False
        result.reason = (f"output structure differs: candidate returned {structure(actual)}, "
                         f"reference returned {structure(expected)}")
        return result
    for (path, a), (_, e) in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            result.passed = False
            result.reason = f"{path}: candidate returned {structure(a)}, reference returned {structure(e)}"
            return result
        if not isinstance(e, torch.Tensor):
            if a != e and not (isinstance(a, float) and isinstance(e, float)
                               and abs(a - e) <= atol + rtol * abs(e)):  # ints: exact
                result.passed = False
                result.reason = f"{path}: candidate returned {a!r}, reference returned {e!r}"
                return result
            continue
        for what, got, want in (("shape", tuple(a.shape), tuple(e.shape)),
                                ("dtype", a.dtype, e.dtype),
                                ("device", a.device, e.device)):
            if got != want:
                result.passed = False
                result.reason = (f"{path}: {what} differs: candidate {describe_tensor(a)}, "
                                 f"reference {describe_tensor(e)}")
                return result
        result.leaves.append(_compare_tensor(path, a, e, atol, rtol, max_listed))
    if result.mismatched:
        result.passed = False
    return result


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(as_bytes(a), as_bytes(b))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as a flat uint8 tensor (a copy when it is not contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[int, tuple[int, ...], float, float]:
    """(elements that differ bitwise, first differing index, value in a, value in b)."""
    wa = as_bytes(a).reshape(a.numel(), -1)
    wb = as_bytes(b).reshape(b.numel(), -1)
    differs = (wa != wb).any(dim=1)
    count = int(differs.sum())
    if not count:
        return 0, (), 0.0, 0.0
    flat = int(torch.nonzero(differs)[0])
    fa, fb = a.detach().reshape(-1), b.detach().reshape(-1)
    if fa.is_complex():
        va, vb = complex(fa[flat]).real, complex(fb[flat]).real
    else:
        va, vb = float(fa[flat]), float(fb[flat])
    return count, _index(flat, a.shape), va, vb


# -- precision -------------------------------------------------------------------------------

def precision_tier(candidate_error: float, reference_error: float) -> str:
    """The precision tier of a candidate from two relative L2 errors against a float64 run of
    the reference: the candidate's, and the float32 reference's own.

    "fp32":      candidate_error <= max(FP32_FACTOR * reference_error, FP32_FLOOR)
    "tf32-like": candidate_error <= TF32_LIMIT (a ~10-bit mantissa: TF32 or fp16)
    "half-like": anything larger (bf16-class rounding)
    "unknown":   an error that is NaN (the float64 run was not possible).
    ("exact" and "wrong" are named by `Precision.measure`.)"""
    if math.isnan(candidate_error) or math.isnan(reference_error):
        return UNKNOWN
    if candidate_error <= max(FP32_FACTOR * reference_error, FP32_FLOOR):
        return FP32
    if candidate_error <= TF32_LIMIT:
        return TF32_LIKE
    return HALF_LIKE


def worst_tier(tiers: list[str]) -> str:
    """The least precise of several tiers ("unknown" only when all are unknown)."""
    known = [t for t in tiers if t in TIER_ORDER]
    if not known:
        return UNKNOWN
    return max(known, key=TIER_ORDER.index)


def float_elements(value: Any) -> int:
    """Elements of the floating-point (and complex) tensors of a nest."""
    return sum(x.numel() for _, x in leaves(value)
               if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()))


def relative_l2_error(actual: Any, reference64: Any) -> float:
    """||actual - ref|| / ||ref|| over every floating-point element of the two nests,
    computed in float64; elements where the float64 reference is not finite are left out.
    When ||ref|| is 0 (an all-zero reference) the root mean square of the candidate's error
    is returned instead: an all-zero answer is judged on the size of what the candidate
    put there, element for element."""
    num = den = 0.0
    count = 0
    for (_, a), (_, r) in zip(leaves(actual), leaves(reference64)):
        if not (isinstance(a, torch.Tensor) and isinstance(r, torch.Tensor)):
            continue
        if not (r.is_floating_point() or r.is_complex()) or a.shape != r.shape:
            continue
        flat_a, flat_r = a.detach().reshape(-1), r.detach().reshape(-1)
        for start in range(0, flat_r.numel(), CHUNK):  # in chunks: float64 copies stay small
            a64 = flat_a[start:start + CHUNK].to(device=r.device, dtype=r.dtype)
            r64 = flat_r[start:start + CHUNK]
            keep = torch.isfinite(r64)
            if not bool(keep.all()):
                a64, r64 = a64[keep], r64[keep]
            num += float(torch.linalg.vector_norm(a64 - r64)) ** 2
            den += float(torch.linalg.vector_norm(r64)) ** 2
            count += r64.numel()
    num, den = math.sqrt(num), math.sqrt(den)
    if den > 0:
        return num / den
    return num / math.sqrt(count) if count else 0.0


def error_bound(max_rel_error: float, reference_error: float) -> float:
    """The largest relative L2 error a candidate may have: cudaopt_max_rel_error, or 10x the
    float32 reference's own error when the problem is so ill-conditioned that the float32
    reference itself is further than that from float64."""
    if math.isnan(reference_error):
        return max_rel_error
    return max(max_rel_error, FP32_FACTOR * reference_error)


@dataclass
class Precision:
    """Measured precision: relative L2 errors against float64, and the tier they name."""

    candidate_error: float
    reference_error: float
    tier: str
    note: str = ""
    bound: float | None = None   # the relative L2 bound the candidate was held to
    vacuous: bool = False        # atol >= max|expected| for some float output

    @classmethod
    def measure(cls, candidate_out: Any, reference_out: Any, reference64_out: Any,
                max_rel_error: float | None = None) -> "Precision":
        if float_elements(reference64_out) == 0:  # integer/bool outputs only: compared exactly
            return cls(0.0, 0.0, EXACT)
        cand = relative_l2_error(candidate_out, reference64_out)
        ref = relative_l2_error(reference_out, reference64_out)
        p = cls(cand, ref, precision_tier(cand, ref))
        if max_rel_error is not None:
            p.bound = error_bound(max_rel_error, ref)
            if not cand <= p.bound:  # NaN included
                p.tier = WRONG
        return p

    @classmethod
    def unknown(cls, note: str) -> "Precision":
        return cls(math.nan, math.nan, UNKNOWN, note)

    @property
    def wrong(self) -> bool:
        return self.tier == WRONG

    def describe(self) -> str:
        if self.tier == UNKNOWN:
            return f"precision unknown ({self.note})" if self.note else "precision unknown"
        if self.tier == EXACT:
            return "exact: integer/bool outputs equal to the reference's"
        text = (f"{self.tier}: relative L2 error vs float64 {self.candidate_error:.2e} "
                f"(float32 reference: {self.reference_error:.2e})")
        if self.bound is not None and self.tier == WRONG:
            text += f" > cudaopt_max_rel_error {self.bound:.2e}"
        return text + (f"; {self.note}" if self.note else "")

    def to_json(self) -> dict[str, Any]:
        return {"candidate_error": _json_float(self.candidate_error),
                "reference_error": _json_float(self.reference_error),
                "tier": self.tier, "note": self.note, "bound": self.bound, "vacuous": self.vacuous}


def _json_float(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


def to_float64(value: Any) -> Any:
    """A nest with every floating-point tensor converted to float64 (complex to complex128)."""
    if isinstance(value, (tuple, list)):
        return type(value)(to_float64(v) for v in value)
    if isinstance(value, dict):
        return {k: to_float64(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.to(torch.complex128)
        if value.is_floating_point():
            return value.to(torch.float64)
    return value


def float64_inputs(inputs: list) -> list:
    """Fresh float64 copies of the inputs (one copy each, not a clone and then a conversion);
    complex tensors become complex128, other values are passed as they are."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            dtype = (torch.complex128 if x.is_complex() else torch.float64 if x.is_floating_point() else x.dtype)
            x = x.to(dtype, copy=True)
        out.append(x)
    return out


def measure_precision(model: torch.nn.Module, model_new: torch.nn.Module, inputs: list) -> Precision:
    """Run the candidate, the float32 reference and a float64 copy of the reference on the
    same inputs and name the candidate's precision tier. The models and inputs are left
    unchanged (the float64 run works on copies)."""
    import copy

    from pytest_cudaopt import memory
    from pytest_cudaopt.timing import clone_inputs

    with torch.no_grad():
        candidate_out = model_new(*clone_inputs(inputs))
        reference_out = model(*clone_inputs(inputs))
        devices = [x.device for x in inputs if isinstance(x, torch.Tensor)]
        free = memory.free_bytes(devices[0]) if devices else None
        in_bytes, out_bytes = memory.nbytes(list(inputs)), memory.nbytes(reference_out)
        if not memory.float64_fits(in_bytes, out_bytes, memory.allocated(devices[0] if devices else None), free):
            return Precision.unknown(f"float64 reference skipped: it needs about "
                                     f"{memory.gib(memory.float64_need(in_bytes, out_bytes))}, beyond the "
                                     f"case's budget or the {memory.gib(free or 0)} free")
        try:
            model64 = copy.deepcopy(model).double()
            reference64_out = model64(*float64_inputs(inputs))
        except Exception as exc:  # a reference that cannot run in float64
            return Precision.unknown(f"the reference does not run in float64: {type(exc).__name__}: {exc}")
    return Precision.measure(candidate_out, reference_out, reference64_out)


# -- the result object the report renders -----------------------------------------------------

def _short_path(path: str) -> str:
    """A workdir as the user named it: relative to the current folder when inside it."""
    import os

    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _sci(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.2e}"


@dataclass
class CorrectnessResult:
    """One correctness item's verdict, appended to `cudaopt_session.results`."""

    workdir: str
    test: str                  # pytest node id
    case: str                  # "canonical seed0", "drawn shapes (25 cases)"
    passed: bool
    shapes: str = ""           # the inputs: "x: float32[16, 256]"
    seed: int | None = None
    cases: int = 0             # cases run (drawn shapes: examples that ran)
    max_abs: float | None = None
    max_rel: float | None = None
    precision: Precision | None = None
    check: str = ""            # the guard or comparison that failed
    message: str = ""
    seconds: float = 0.0
    kind: str = "correctness"
    peak_bytes: int | None = None  # torch's max allocated device memory during the item

    def row(self) -> dict[str, str]:
        p = self.precision if self.precision is not None and self.precision.tier != UNKNOWN else None
        return {
            "workdir": _short_path(self.workdir),
            "case": self.case,
            "inputs": self.shapes,
            "max abs err": _sci(self.max_abs),
            "max rel err": _sci(self.max_rel),
            "rel L2 vs fp64": _sci(p.candidate_error if p else None),
            "fp32 ref vs fp64": _sci(p.reference_error if p else None),
            "precision": (self.precision.tier + (" (atol vacuous)" if self.precision.vacuous else ""))
                         if self.precision else "-",
            "verdict": "pass" if self.passed else f"FAIL ({self.check})" if self.check else "FAIL",
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "workdir": self.workdir, "test": self.test, "case": self.case,
            "passed": self.passed, "inputs": self.shapes, "seed": self.seed, "cases": self.cases,
            "max_abs": _json_float(self.max_abs), "max_rel": _json_float(self.max_rel),
            "precision": self.precision.to_json() if self.precision else None,
            "check": self.check, "message": self.message, "seconds": self.seconds,
            "peak_bytes": self.peak_bytes,
        }
