"""Value families: input values beyond model.py's own (scaled, shifted, heavy-tailed, sparse spikes), drawn under a case's secret seed.

A kernel can be right only for what `get_inputs()` draws (a softmax without the row max is exact on `randn`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

MODEL = "model"
# The order the canonical seeds 1, 2, ... take them: the two that catch most (a subsample, a
# missing max) come first, so the default three seeds judge them at the canonical size.
FAMILIES = ("spikes", "heavy", "large", "shifted", "small")
ALL = (MODEL, *FAMILIES)
DESCRIBED = {
    MODEL: "model.py's own values", "spikes": "a few elements of one input changed by a lot",
    "heavy": "heavy-tailed: each element times a Pareto(1.5) factor", "large": "scaled by a factor in [20, 200]",
    "shifted": "shifted away from zero by 8..32 times the input's RMS", "small": "scaled by a factor in [1e-3, 1e-2]"}
SPIKES = 8              # elements changed in the spiked input
PARETO_ALPHA = 1.5      # heavy tails: infinite variance, finite mean
MOST_FACTOR = 1e6       # no heavy-tail factor or spike (in RMS) beyond this
# An honest lower-precision kernel rounds what it reads: each output element may be off by
# ROUNDED_FACTOR times how far the float64 reference moves when the inputs are off by ROUNDING.
ROUNDING = 2.0 ** -8
ROUNDED_FACTOR = 2.0
# Where that rounding moves the output by more than this (relative L2), the function is nearly
# discontinuous there: the element-wise tolerance is left out and the relative L2 bound decides.
ILL_CONDITIONED = 1e-2


class FamilySkipped(Exception):
    """The family cannot be judged on this case (the message says why)."""


def parse(text: str) -> tuple[str, ...]:
    """The `cudaopt_values` setting: 'all', 'none' or a comma-separated subset of FAMILIES."""
    text = str(text).strip().lower()
    if text in ("all", ""):
        return FAMILIES
    if text == "none":
        return ()
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in FAMILIES]
    if unknown:
        raise ValueError(f"expected all, none or some of {', '.join(FAMILIES)}; got {', '.join(unknown)}")
    return tuple(name for name in FAMILIES if name in chosen)


def canonical_family(seed_index: int, allowed: tuple[str, ...]) -> str:
    """seed0: model.py's values; seed k: the allowed families in turn."""
    if seed_index == 0 or not allowed:
        return MODEL
    return allowed[(seed_index - 1) % len(allowed)]


def strategy(allowed: tuple[str, ...]):
    """A drawn shape's family: model.py's values about half the time, else one of `allowed`."""
    from hypothesis import strategies as st

    return st.one_of(st.just(MODEL), st.sampled_from(allowed)) if allowed else st.just(MODEL)


def split_case(text: str) -> tuple[str, str]:
    """'batch_size=3,values=heavy' -> ('batch_size=3', 'heavy'); no `values=`: model."""
    parts, family = [], MODEL
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name.strip() == "values":
            family = value.strip()
            if family not in ALL:
                raise ValueError(f"--cudaopt-case: values={family}: expected one of {', '.join(ALL)}")
        else:
            parts.append(part)
    return ",".join(parts), family


@dataclass
class Applied:
    """A family applied to one case's inputs: what changed, for messages and the diagnosis."""

    family: str
    lines: list[str] = field(default_factory=list)
    spiked: int | None = None                    # input index of the spikes
    spikes: list[tuple[tuple[int, ...], float, float]] = field(default_factory=list)  # (index, before, after)
    base_scale: float | None = None              # output_scale of the reference on model.py's values

    def describe(self) -> str:
        return "; ".join([f"values: {self.family} ({DESCRIBED.get(self.family, self.family)})", *self.lines])

    def restore(self, inputs: list) -> list:
        """Copies of `inputs` with the spikes undone (model.py's own values)."""
        base = list(inputs)
        if self.spiked is not None:
            x = inputs[self.spiked].clone()
            for index, before, _ in self.spikes:
                x[index] = before
            base[self.spiked] = x
        return base


def _floats(inputs: list) -> list[int]:
    import torch

    return [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0]


def _rms(x: torch.Tensor, sample: int = 1 << 20) -> float:
    """The root mean square of (an evenly strided sample of) x: no float64 copy of a large input."""
    flat = x.detach().reshape(-1)
    flat = flat[::max(1, flat.numel() // sample)].double()
    value = float(flat.pow(2).mean().sqrt())
    return value if math.isfinite(value) and value > 0 else 1.0


def input_label(i: int, names: list[str] | None) -> str:
    return f"input {i} ({names[i]})" if names and i < len(names) else f"input {i}"


def _limit(x: torch.Tensor) -> float:
    """The largest magnitude a changed value may take: its square stays finite in its dtype."""
    import torch

    return math.sqrt(torch.finfo(x.dtype).max)


def apply(family: str, inputs: list, seed: int, names: list[str] | None = None) -> tuple[list, Applied]:
    """(new inputs, what changed): the floating-point inputs changed as `family` says, drawn
    from `seed` (small draws on the CPU, element-wise factors on the inputs' device)."""
    import torch

    from pytest_cudaopt.correctness.compare import unravel

    applied = Applied(family)
    floats = _floats(inputs)
    if family == MODEL or not floats:
        return list(inputs), applied
    out = list(inputs)
    host = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=host))

    def away(x: torch.Tensor) -> Callable[[], float]:  # the sign of a move: the side x keeps to, else random
        side = 1.0 if bool((x >= 0).all()) else -1.0 if bool((x <= 0).all()) else None
        return lambda: side or (1.0 if uniform(0, 1) < 0.5 else -1.0)

    if family == "spikes":
        i = floats[int(torch.randint(len(floats), (), generator=host))]
        x = inputs[i].clone()
        rms, numel, sign = _rms(x), x.numel(), away(x)
        # Big enough that k spikes move a mean over every element well past the tolerance.
        size = min(max(100.0, numel / (10 * SPIKES)), MOST_FACTOR) * rms
        for flat in sorted(set(torch.randint(numel, (min(SPIKES, numel),), generator=host).tolist())):
            index = unravel(flat, x.shape)
            before = float(x[index])
            x[index] = max(-_limit(x), min(_limit(x), before + sign() * size * uniform(1.0, 2.0)))
            applied.spikes.append((index, before, float(x[index])))
        out[i], applied.spiked = x, i
        shown = ", ".join(f"{list(index)} {before:.4g} -> {after:.4g}" for index, before, after in applied.spikes[:4])
        more = f" (+{len(applied.spikes) - 4} more)" if len(applied.spikes) > 4 else ""
        applied.lines.append(f"{input_label(i, names)} at {shown}{more}")
        return out, applied
    for i in floats:
        x = inputs[i]
        if family in ("large", "small"):
            low, high = (20.0, 200.0) if family == "large" else (1e-3, 1e-2)
            factor = math.exp(uniform(math.log(low), math.log(high)))
            new = x * factor
            applied.lines.append(f"{input_label(i, names)} x {factor:.4g}")
        elif family == "shifted":
            shift = away(x)() * uniform(8.0, 32.0) * _rms(x)
            new = x + shift
            applied.lines.append(f"{input_label(i, names)} {'+' if shift >= 0 else '-'} {abs(shift):.4g}")
        elif family == "heavy":
            generator = torch.Generator(device=x.device).manual_seed(int(torch.randint(1 << 62, (), generator=host)))
            u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
            new = x * u.clamp_min(1e-30).pow(-1.0 / PARETO_ALPHA).clamp_max(MOST_FACTOR).to(x.dtype)
            applied.lines.append(f"{input_label(i, names)} max |x| {float(new.abs().max()):.4g}")
        else:
            raise ValueError(f"unknown value family {family!r}")
        out[i] = new.clamp(-_limit(x), _limit(x))
    return out, applied


def output_scale(nest: Any, sample: int = 1 << 20) -> float:
    """The 0.75 quantile of |x| over (a sample of) a nest's finite float elements, else their
    mean |x|, else 1: robust, so that a few spikes or heavy tails do not set it."""
    import torch

    from pytest_cudaopt.primitives.tensors import leaves

    parts = [t.detach().reshape(-1)[::max(1, t.numel() // sample)].double().abs() for _, t in leaves(nest)
             if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    if not parts:
        return 1.0
    # On the outputs' device: a quantile sorts, 30-60 ms a case on the judging process's CPU, well under 1 ms on a GPU.
    values = torch.cat([p.to(parts[0].device) for p in parts])
    values = values[torch.isfinite(values)]
    if not values.numel():
        return 1.0
    scale = float(torch.quantile(values, 0.75))
    if scale <= 0:
        scale = float(values.mean())
    return scale if scale > 0 and math.isfinite(scale) else 1.0


def not_finite(expected: Any, reference64: Any) -> str:
    """Why a family cannot be judged on this case: a reference is not finite ("" when it can)."""
    import torch

    from pytest_cudaopt.primitives.tensors import leaves

    for (path, e), (_, r) in zip(leaves(expected), leaves(reference64)):
        if not (isinstance(r, torch.Tensor) and r.is_floating_point() and r.numel()):
            continue
        bad64 = int((~torch.isfinite(r)).sum())
        if bad64:
            return f"the float64 reference is not finite at {bad64} of {r.numel()} elements of {path}"
        if isinstance(e, torch.Tensor) and e.shape == r.shape:
            bad32 = int((~torch.isfinite(e)).sum())
            if bad32:
                return (f"the float32 reference overflows at {bad32} of {e.numel()} elements of {path} "
                        f"(the float64 one is finite)")
    return ""


GROWTH = 100.0  # a family's error, over the float32 reference's own, this many times model.py's: wrong


@dataclass
class Seen:
    """What one family met in an item: cases, skips, the worst precision and its case."""

    cases: int = 0
    skipped: int = 0
    why: str = ""
    worst: Any = None            # Precision
    where: str = ""              # the case of the worst, and its worst element

    def excess(self) -> float:
        p = self.worst
        if p is None or not math.isfinite(p.candidate_error) or not math.isfinite(p.reference_error):
            return math.nan
        return p.candidate_error / max(p.reference_error, 1e-9)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"cases": self.cases, "tier": self.worst.tier if self.worst else None}
        if self.worst is not None:
            found.update(candidate_error=self.worst.candidate_error, reference_error=self.worst.reference_error)
        if self.skipped:
            found["skipped"], found["why"] = self.skipped, self.why
        return found


def record(seen: dict[str, Seen], family: str, precision: Any, where: str, skipped: str = "") -> None:
    """Add one case's outcome to `seen` (family -> Seen); an unknown precision is not kept."""
    from pytest_cudaopt.correctness.precision import TIER_ORDER

    if skipped:
        entry = seen.setdefault(family, Seen())
        entry.skipped, entry.why = entry.skipped + 1, skipped
        family = MODEL  # judged on model.py's values instead
    entry = seen.setdefault(family, Seen())
    entry.cases += 1
    if precision is not None and precision.tier in TIER_ORDER and precision.worse_than(entry.worst):
        entry.worst, entry.where = precision, where


def grown(seen: dict[str, Seen]) -> str:
    """The failure for an error that grows with the values ("" when none does): a family whose tier is below
    model.py's values' and whose error over the float32 reference's is GROWTH times what it is on them."""
    from pytest_cudaopt.correctness.precision import TIER_ORDER

    base = seen.get(MODEL)
    if base is None or base.worst is None or base.worst.tier not in TIER_ORDER or not math.isfinite(base.excess()):
        return ""
    lines = []
    for family, entry in seen.items():
        p = entry.worst
        if family == MODEL or p is None or p.tier not in TIER_ORDER:
            continue
        worse = TIER_ORDER.index(p.tier) > TIER_ORDER.index(base.worst.tier)
        if worse and entry.excess() > GROWTH * max(base.excess(), 1.0):
            lines.append(
                f"values {family}: {p.tier}, relative L2 error vs float64 {p.candidate_error:.3g} (float32 reference "
                f"{p.reference_error:.3g}) on {entry.where}; on model.py's values {base.worst.tier} "
                f"({base.worst.candidate_error:.3g}, float32 reference {base.worst.reference_error:.3g})")
    if not lines:
        return ""
    return ("ModelNew's error grows with the input values: precision is a property of the arithmetic, "
            "an error many times larger on some values is a wrong function, not a precision tier\n" + "\n".join(lines))


def worst_element(comparison: Any) -> str:
    """', worst at output[3, 7]: actual 1.5, expected 1.25' of a comparison, or ""."""
    for leaf in getattr(comparison, "leaves", ()):
        if leaf.worst is not None and not leaf.exact:
            index = ", ".join(str(i) for i in leaf.worst.index)
            return (f", worst at {leaf.path}[{index}]: actual {leaf.worst.actual:.6g}, "
                    f"expected {leaf.worst.expected:.6g}")
    return ""
