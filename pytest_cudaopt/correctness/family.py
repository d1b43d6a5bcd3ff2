"""A value-family case judged: against a float64 run of the reference, skipped where that run is not finite, and what a spike the candidate did not follow says."""

from __future__ import annotations

from typing import Any

import torch

from pytest_cudaopt.correctness import compare, guards, values
from pytest_cudaopt.correctness.precision import FP32_FACTOR, Precision, relative_l2_error, run_float64
from pytest_cudaopt.primitives.tensors import clone_inputs, leaves


def judge(applied: values.Applied, trial: guards.Trial, inputs: list, first: Any,
          expected: Any) -> tuple[compare.Comparison, Precision]:
    """A value-family case against a float64 run of the reference (values.FamilySkipped where that run is
    missing or not finite): the comparison, its tolerance grown by `_allowance`, and the precision."""
    reference64, why = guards.float64_reference(trial, inputs, expected)
    why = why if reference64 is None else values.not_finite(expected, reference64)
    if why:
        raise values.FamilySkipped(why)
    # atol grows with the output, never shrinks: tiny outputs are left to rtol and the L2 bound.
    base = applied.base_scale  # None (spikes): the output's scale is model.py's
    scale = 1.0 if base is None else max(1.0, values.output_scale(reference64) / base)
    rounded64 = _rounded64(trial, inputs, expected)
    sensitivity = relative_l2_error(rounded64, reference64) if rounded64 is not None else 0.0
    ill = sensitivity > values.ILL_CONDITIONED
    allowance = _allowance(expected, reference64, rounded64, ill)
    comparison = compare.compare_outputs(first, expected, atol=trial.atol * scale, rtol=trial.rtol, allowance=allowance)
    if not comparison.passed:
        guards.check_comparison(
            comparison, _unmoved(applied, trial, inputs, first, expected) if applied.spiked is not None else "")
    precision = Precision.measure(first, expected, reference64, trial.max_rel_error, conditioned=True,
                                  sensitivity=sensitivity)
    if ill:
        precision.note = (f"on these values the output moves {sensitivity:.2g} (relative L2) when the inputs are "
                          f"rounded at bfloat16's precision: the element-wise tolerance is left out, the relative "
                          f"L2 bound decides")
    if precision.wrong and applied.spiked is not None:  # the guards' failure prints the note
        precision.note = _unmoved(applied, trial, inputs, first, expected).strip()
    return comparison, precision


def _rounded64(trial: guards.Trial, inputs: list, expected: Any) -> Any:
    """The float64 reference on the inputs rounded about as bfloat16 rounds them, None when it cannot run."""
    def round_(x: Any) -> Any:
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            return x
        generator = torch.Generator(device=x.device).manual_seed(0)
        # Every element off by the full ROUNDING, up or down: a spike moves as much as the rest.
        signs = torch.randint(2, x.shape, generator=generator, device=x.device).to(x.dtype) * 2 - 1
        return x * (1 + values.ROUNDING * signs)

    return run_float64(trial.model, [round_(x) for x in inputs], expected, trial.device, trial.model64,
                       trial.work_bytes)[0]


def _allowance(expected: Any, reference64: Any, rounded64: Any, ill: bool) -> dict[str, torch.Tensor]:
    """Leaf path -> what each output element may be off besides atol and rtol: FP32_FACTOR x the float32
    reference's own error plus ROUNDED_FACTOR x how far its row moves with rounded inputs; anything if `ill`."""
    found = {}
    rounded = dict(leaves(rounded64)) if rounded64 is not None else {}
    for (path, e), (_, r) in zip(leaves(expected), leaves(reference64)):
        if not (isinstance(e, torch.Tensor) and isinstance(r, torch.Tensor) and e.is_floating_point()
                and e.shape == r.shape):
            continue
        if ill:
            found[path] = torch.full_like(e, torch.finfo(e.dtype).max)
            continue
        # In place: one float64 copy of the output at a time besides `allowed` (host memory on the CPU is the plan's).
        allowed = e.double().sub_(r).abs_().mul_(FP32_FACTOR)
        n = rounded.get(path)
        if isinstance(n, torch.Tensor) and n.shape == r.shape:
            moved = (n - r).abs_().nan_to_num_(0.0, 0.0, 0.0)
            if moved.dim():  # a row (softmax's, attention's) that rounding moves may move anywhere in it
                moved = moved.amax(dim=-1, keepdim=True).expand_as(moved)
            allowed.add_(moved, alpha=values.ROUNDED_FACTOR)
            del moved
        found[path] = allowed.float()
    return found


def _unmoved(applied: values.Applied, trial: guards.Trial, inputs: list, first: Any, expected: Any) -> str:
    """After a spikes case failed: how each model's output moved where the spikes moved the
    reference's most ("" when that cannot be told)."""
    base = applied.restore(inputs)
    try:
        candidate = guards.run_candidate(trial, guards.for_candidate(trial, base))
        with torch.no_grad():
            reference = trial.model(*clone_inputs(base))
    except (guards.GuardFailure, guards.CandidateError, guards.ReferenceError_, RuntimeError):
        return ""
    pairs = [(p, e, r, a, c) for (p, e), (_, r), (_, a), (_, c) in
             zip(leaves(expected), leaves(reference), leaves(first), leaves(candidate))
             if isinstance(e, torch.Tensor) and e.is_floating_point() and e.numel()
             and all(isinstance(t, torch.Tensor) and t.shape == e.shape for t in (r, a, c))]
    if not pairs:
        return ""
    path, e, r, a, c = pairs[0]
    moved = (e.double() - r.double()).abs().nan_to_num(0.0, 0.0, 0.0).reshape(-1)
    at = int(torch.argmax(moved))
    index = compare.unravel(at, e.shape)
    flat = [t.reshape(-1)[at].item() for t in (r, e, c, a)]
    how = "did not move" if flat[2] == flat[3] else "moved differently"
    where = ", ".join(str(list(index_)) for index_, _, _ in applied.spikes)
    return (f"\nevery input element must be able to move the output: changing "
            f"{values.input_label(applied.spiked, trial.input_names)} at {where} moved the reference's "
            f"{path}{list(index)} from {flat[0]:.6g} to {flat[1]:.6g}; ModelNew's {how}: from {flat[2]:.6g} to "
            f"{flat[3]:.6g}")
