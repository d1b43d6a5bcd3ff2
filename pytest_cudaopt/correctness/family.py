"""A value-family case judged: against a float64 run of the reference, skipped where that run is not finite, and what a spike the candidate did not follow says."""

from __future__ import annotations

from typing import Any

import torch

from pytest_cudaopt.correctness import compare, guards, values
from pytest_cudaopt.correctness.faults import CudaFault
from pytest_cudaopt.correctness.precision import FP32_FACTOR, Precision, run_float64
from pytest_cudaopt.tensors import clone_inputs, leaves


def judge(applied: values.Applied, trial: guards.Trial, inputs: list, first: Any,
          expected: Any) -> tuple[compare.Comparison, Precision]:
    """A value-family case, against a float64 run of the reference: skipped (values.FamilySkipped)
    where that run is missing or not finite; else the comparison with atol scaled as the
    reference's output grew and `FP32_FACTOR` times the float32 reference's own error added to
    each element's tolerance, and the tier measured with the limits that grow with it."""
    try:
        reference64, why = run_float64(trial.model, inputs, expected, trial.device, trial.model64)
    except Exception as exc:  # the float64 run lost the CUDA context
        raise CudaFault(f"Model.forward in float64 raised: {exc}") from exc
    if reference64 is None:
        raise values.FamilySkipped(why)
    why = values.not_finite(expected, reference64)
    if why:
        raise values.FamilySkipped(why)
    # atol grows with the output (scaled inputs, scaled outputs), never shrinks: tiny outputs
    # (softmax's tails) are left to rtol and the relative L2 bound, as on model.py's values.
    base = applied.base_scale  # None (spikes): the output's scale is model.py's
    scale = 1.0 if base is None else max(1.0, values.output_scale(reference64) / base)
    comparison = compare.compare_outputs(first, expected, atol=trial.atol * scale, rtol=trial.rtol,
                                         reference64=reference64, slack=FP32_FACTOR)
    if not comparison.passed:
        guards.check_comparison(
            comparison, _unmoved(applied, trial, inputs, first, expected) if applied.spiked is not None else "")
    precision = Precision.measure(first, expected, reference64, trial.max_rel_error, conditioned=True)
    if precision.wrong and applied.spiked is not None:  # the guards' failure prints the note
        precision.note = _unmoved(applied, trial, inputs, first, expected).strip()
    return comparison, precision


def _unmoved(applied: values.Applied, trial: guards.Trial, inputs: list, first: Any, expected: Any) -> str:
    """After a spikes case failed: both models on the inputs without the spikes, and where the
    reference's output moved most, how each moved ("" when that cannot be told)."""
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
             and isinstance(r, torch.Tensor) and r.shape == e.shape
             and isinstance(a, torch.Tensor) and a.shape == e.shape
             and isinstance(c, torch.Tensor) and c.shape == e.shape]
    if not pairs:
        return ""
    path, e, r, a, c = pairs[0]
    moved = (e.double() - r.double()).abs().nan_to_num(0.0, 0.0, 0.0).reshape(-1)
    at = int(torch.argmax(moved))
    index = values.unravel(at, e.shape)
    flat = [t.reshape(-1)[at].item() for t in (r, e, c, a)]
    how = "did not move" if flat[2] == flat[3] else "moved differently"
    i = applied.spiked
    name = (trial.input_names[i] if trial.input_names and i < len(trial.input_names) else "")
    where = ", ".join(str(list(index_)) for index_, _, _ in applied.spikes)
    return (f"\nevery input element must be able to move the output: changing input {i}"
            f"{f' ({name})' if name else ''} at {where} moved the reference's {path}{list(index)} from "
            f"{flat[0]:.6g} to {flat[1]:.6g}; ModelNew's {how}: from {flat[2]:.6g} to {flat[3]:.6g}")
