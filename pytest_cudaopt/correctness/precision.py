"""Precision measured against float64: the relative L2 error, the tier it names, and the float64 run of the reference."""

from __future__ import annotations

import copy
import math
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from pytest_cudaopt.correctness.faults import context_lost
from pytest_cudaopt.primitives import memory
from pytest_cudaopt.primitives.tensors import clone_inputs, float64_inputs, float_elements, leaves, nbytes, to_float64

# Tiers, from the candidate's relative L2 error against a float64 run of the reference. Float32
# rounding leaves ~1e-7..1e-6; a 10-bit mantissa (TF32, fp16) ~3e-4..6e-4; bf16 ~2e-3..4e-3.
FP32, TF32_LIKE, HALF_LIKE, UNKNOWN = "fp32", "tf32-like", "half-like", "unknown"
EXACT, WRONG = "exact", "wrong"
TIERS = (FP32, TF32_LIKE, HALF_LIKE)
TIER_ORDER = (EXACT, FP32, TF32_LIKE, HALF_LIKE, WRONG)
FP32_FACTOR = 10.0     # within 10x the float32 reference's own error ...
FP32_FLOOR = 1e-5      # ... or below this, whichever is larger: fp32
TF32_LIMIT = 1e-3      # up to this: tf32-like; above it: half-like
CHUNK = 1 << 24        # elements compared at a time: the float64 temporaries stay ~128 MiB each
# Where a value family leaves the float32 reference's own error above this (ill-conditioned), the
# limits past fp32 grow in proportion, so that a TF32- or half-precise kernel keeps its tier.
TYPICAL_REFERENCE_ERROR = 1e-7
# The bound grows with the conditioning at most this much (uncapped, GPT-2 attention's spikes
# allowed a relative L2 error of 0.74); past it, the sensitivity term decides.
BOUND_CONDITIONING_CAP = 10.0
# One scalar's error is a draw, not a figure: a precision is measured over input sets until their outputs hold
# POOL_ELEMENTS float elements, or over POOL_SETS sets (`pooled`).
POOL_ELEMENTS = 4096
POOL_SETS = 8


def conditioning(reference_error: float) -> float:
    """How much larger than usual the float32 reference's own error is (at least 1)."""
    return 1.0 if math.isnan(reference_error) else max(1.0, reference_error / TYPICAL_REFERENCE_ERROR)


def precision_tier(candidate_error: float, reference_error: float, conditioned: bool = False,
                   sensitivity: float = 0.0) -> str:
    """The tier of the candidate's relative L2 error against float64, given the float32 reference's own.
    `conditioned`: TF32_LIMIT grows with the conditioning, to at least half the `sensitivity` (TF32 rounds 8x finer)."""
    if math.isnan(candidate_error) or math.isnan(reference_error):
        return UNKNOWN
    if candidate_error <= max(FP32_FACTOR * reference_error, FP32_FLOOR):
        return FP32
    limit = max(TF32_LIMIT * conditioning(reference_error), sensitivity / 2) if conditioned else TF32_LIMIT
    if candidate_error <= limit:
        return TF32_LIKE
    return HALF_LIKE


def below_fp32(tier: str | None) -> bool:
    """True for a measured tier less precise than fp32 ("unknown" is not)."""
    return tier in TIERS[1:]


def relative_l2_error(actual: Any, reference64: Any) -> float:
    """||actual - ref|| / ||ref|| over every floating-point element of the two nests, in float64,
    where the reference is finite; for an all-zero reference, the RMS of the candidate's error."""
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


def error_bound(max_rel_error: float, reference_error: float, conditioned: bool = False,
                sensitivity: float = 0.0) -> float:
    """The largest relative L2 error a candidate may have: cudaopt_max_rel_error, or 10x the float32
    reference's own error where larger; `conditioned`: grown with the conditioning, at least 2x `sensitivity`."""
    if math.isnan(reference_error):
        return max_rel_error
    if not conditioned:
        return max(max_rel_error, FP32_FACTOR * reference_error)
    grown = max_rel_error * min(conditioning(reference_error), BOUND_CONDITIONING_CAP)
    return max(grown, FP32_FACTOR * reference_error, 2 * sensitivity)


@dataclass
class Precision:
    """Measured precision: relative L2 errors against float64, and the tier they name."""

    candidate_error: float
    reference_error: float
    tier: str
    note: str = ""
    bound: float | None = None   # the relative L2 bound the candidate was held to
    vacuous: bool = False        # atol >= max|expected| for some float output
    sets: int = 1                # input sets its errors are the root mean square over (`pooled`)

    @classmethod
    def measure(cls, candidate_out: Any, reference_out: Any, reference64_out: Any,
                max_rel_error: float | None = None, conditioned: bool = False, sensitivity: float = 0.0) -> "Precision":
        if float_elements(reference64_out) == 0:  # integer/bool outputs only: compared exactly
            return cls(0.0, 0.0, EXACT)
        cand = relative_l2_error(candidate_out, reference64_out)
        ref = relative_l2_error(reference_out, reference64_out)
        p = cls(cand, ref, precision_tier(cand, ref, conditioned, sensitivity))
        if max_rel_error is not None:
            p.bound = error_bound(max_rel_error, ref, conditioned, sensitivity)
            if not cand <= p.bound:  # NaN included
                p.tier = WRONG
        return p

    @classmethod
    def against_float32(cls, candidate_out: Any, expected: Any, why: str,
                        max_rel_error: float | None = None) -> "Precision":
        """No float64 run (`why`): the tier is unknown, but the relative L2 bound still holds."""
        if float_elements(expected) == 0:
            return cls(0.0, 0.0, EXACT)
        precision = cls(math.nan, math.nan, UNKNOWN, why)
        if max_rel_error is not None:
            error = relative_l2_error(candidate_out, to_float64(expected))
            if not error <= max_rel_error:
                precision.tier, precision.candidate_error, precision.bound = WRONG, error, max_rel_error
        return precision

    @property
    def wrong(self) -> bool:
        return self.tier == WRONG

    def worse_than(self, other: "Precision | None") -> bool:
        """A less precise tier than `other`'s, or the same with a larger error; an unknown tier
        ranks below every measured one, and anything above None."""
        def rank(p: Precision) -> tuple[int, float]:
            return TIER_ORDER.index(p.tier) if p.tier in TIER_ORDER else -1, p.candidate_error
        return other is None or rank(self) > rank(other)

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
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Precision":
        """`to_json`'s dict read back (a JSON report writes NaN as null)."""
        errors = {k: math.nan if data.get(k) is None else float(data[k])
                  for k in ("candidate_error", "reference_error")}
        return cls(**errors, tier=str(data["tier"]), note=str(data.get("note") or ""), bound=data.get("bound"),
                   vacuous=bool(data.get("vacuous", False)), sets=int(data.get("sets") or 1))

    def steady(self, elements: int) -> bool:
        """Whether its figures are steady for outputs of `elements` float elements: over POOL_ELEMENTS of them,
        or over POOL_SETS input sets."""
        return self.sets >= pool_sets(elements)


def pool_sets(elements: int) -> int:
    """How many input sets a steady precision of outputs of `elements` float elements is measured over."""
    return max(1, min(POOL_SETS, math.ceil(POOL_ELEMENTS / max(1, elements))))


def pooled(measure: Callable[[], Precision], elements: int) -> Precision:
    """The precision over one input set, or for outputs of fewer than POOL_ELEMENTS float elements over up to
    POOL_SETS (`measure()` draws the next; `combined`). An exact, unknown or wrong set ends it: its precision is
    the answer."""
    found = [measure()]
    while len(found) < pool_sets(elements) and found[-1].tier not in (EXACT, UNKNOWN, WRONG):
        found.append(measure())
    return found[-1] if found[-1].tier in (EXACT, UNKNOWN, WRONG) else combined(found)


def combined(found: list[Precision]) -> Precision:
    """One precision of several input sets' (none exact): each error the root mean square of the measured ones', the
    tier theirs names. A set without a float64 run (memory) is left out; `sets` counts the others."""
    measured = [p for p in found if not (math.isnan(p.candidate_error) or math.isnan(p.reference_error))]
    found = measured or found[:1]
    if len(found) == 1:
        return found[0]

    def rms(values: list[float]) -> float:
        return math.sqrt(sum(v * v for v in values) / len(values))

    candidate, reference = rms([p.candidate_error for p in found]), rms([p.reference_error for p in found])
    first = found[0]
    note = f"root mean square over {len(found)} input sets" + (f"; {first.note}" if first.note else "")
    return Precision(candidate, reference, precision_tier(candidate, reference), note=note, bound=first.bound,
                     vacuous=any(p.vacuous for p in found), sets=len(found))


def float64_copy(model: torch.nn.Module) -> torch.nn.Module | None:
    """A float64 copy of the reference (None when it cannot be made)."""
    try:
        return copy.deepcopy(model).double()
    except Exception:
        return None


def run_float64(model: torch.nn.Module, inputs: list, expected: Any, device: torch.device | str | None,
                model64: torch.nn.Module | None = None, work_bytes: int = 0) -> tuple[Any, str]:
    """(outputs, "") of a float64 copy of the reference (`model64`, else one made here) on float64 copies of
    `inputs`, or (None, why not). `work_bytes`: the float32 reference's intermediates (MetaCheck.work_bytes).
    A CUDA error that loses the context is raised."""
    free = memory.free_bytes(device) if device is not None else None
    in_bytes, out_bytes = nbytes(list(inputs)), nbytes(expected)
    held = memory.allocated(device)
    if not memory.float64_fits(in_bytes, out_bytes, held, free, work_bytes):
        need = memory.float64_need(in_bytes, out_bytes, work_bytes)
        within = f" ({memory.gib(2 * work_bytes)} of it intermediates)" if work_bytes else ""
        return None, (f"float64 reference skipped: it needs about {memory.gib(need)}{within}, beyond the case's "
                      f"budget of {memory.gib(memory.case_budget(in_bytes, out_bytes))} beside the {memory.gib(held)} this "
                      f"process holds, or the {memory.gib(free or 0)} free")
    model64 = model64 if model64 is not None else float64_copy(model)
    if model64 is None:
        return None, "no float64 copy of the reference"
    try:
        with torch.no_grad():
            out = model64(*float64_inputs(inputs))
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        if context_lost(exc):
            raise
        return None, f"the reference does not run in float64: {type(exc).__name__}: {exc}"
    return out, ""


def measure_precision(model: torch.nn.Module, candidate: Callable[..., Any], inputs: list,
                      max_rel_error: float | None = None) -> Precision:
    """The candidate's precision tier: it, the reference and a float64 copy of it on copies of `inputs`."""
    with torch.no_grad():
        candidate_out = candidate(*clone_inputs(inputs))
        reference_out = model(*clone_inputs(inputs))
    devices = [x.device for x in inputs if isinstance(x, torch.Tensor)]
    reference64, why = run_float64(model, inputs, reference_out, devices[0] if devices else None)
    if reference64 is None:
        return Precision.against_float32(candidate_out, reference_out, why, max_rel_error)
    return Precision.measure(candidate_out, reference_out, reference64, max_rel_error)
