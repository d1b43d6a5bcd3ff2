"""Runtime guards of the correctness verdict: secret inputs, clones, fresh outputs, poison, determinism, and one case through them all."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from pytest_cudaopt.correctness import compare
from pytest_cudaopt.correctness.faults import CudaFault, WorkerCrash, context_alive, is_cuda_fault
from pytest_cudaopt.correctness.precision import Precision, run_float64
from pytest_cudaopt.correctness.values import input_label
from pytest_cudaopt.primitives.tensors import clone_inputs, clone_nest, describe_tensor, leaves
from pytest_cudaopt.run.watchdog import harness_step
from pytest_cudaopt.remote.candidate import Candidate, WorkerError, WorkerFailed

FILE = "model_new.py"  # named in the guards' messages


class GuardFailure(AssertionError):
    """A guard caught the candidate; `check` names the guard, the message says what it saw."""

    def __init__(self, check: str, message: str, comparison: "compare.Comparison | None" = None,
                 precision: "Precision | None" = None):
        super().__init__(message)
        self.check, self.message, self.comparison, self.precision = check, message, comparison, precision


class CandidateError(Exception):
    """ModelNew (or its extension) raised; the message has the workdir's traceback lines. `file`: the workdir
    file at fault where it is not model_new.py (model.py's inputs that cannot reach ModelNew's process)."""

    def __init__(self, message: str, file: str | None = None):
        super().__init__(message)
        self.file = file


class ReferenceError_(Exception):
    """model.py's Model raised on a case (for a drawn shape: the shape is not valid)."""


def derive_seed(session_seed: int, *parts: Any) -> int:
    """A 63-bit seed for one trial from the session's secret seed and the trial's identity."""
    text = repr((int(session_seed), *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def check_inputs_unchanged(before: list, after: list, names: list[str] | None = None) -> None:
    """After the candidate's call its inputs must be bit-identical to their copies."""
    for i, (b, a) in enumerate(zip(before, after)):
        if not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            raise GuardFailure("input mutated", (
                f"{FILE}: ModelNew.forward changed {input_label(i, names)} from {describe_tensor(b)} "
                f"to {describe_tensor(a)} in place; a candidate must leave its inputs alone"))
        count, index, was, now = compare.first_difference(b, a)
        if count:
            raise GuardFailure("input mutated", (
                f"{FILE}: ModelNew.forward wrote into {input_label(i, names)} {describe_tensor(b)}: "
                f"{count} of {b.numel()} elements changed (first at {list(index)}: {was:.6g} -> {now:.6g}); "
                f"a candidate must leave its inputs alone"))


def check_state_unchanged(before: dict[str, torch.Tensor], model_new: Candidate) -> None:
    """ModelNew's parameters and buffers must be as they were before the call."""
    for name, now in model_new.state_dict().items():
        was = before.get(name)
        if was is None or not isinstance(now, torch.Tensor):
            continue
        if not compare.bitwise_equal(was, now):
            count, index, a, b = (compare.first_difference(was, now) if was.shape == now.shape
                                  else (now.numel(), (), 0.0, 0.0))
            raise GuardFailure("state mutated", (
                f"{FILE}: ModelNew.forward changed its parameter/buffer '{name}' "
                f"({count} elements; first at {list(index)}: {a:.6g} -> {b:.6g})"))


def _storage_span(t: torch.Tensor) -> tuple[torch.device, int, int] | None:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    if start == 0 or storage.nbytes() == 0:
        return None
    return t.device, start, start + storage.nbytes()


def _overlaps(a: tuple | None, b: tuple | None) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def check_audit(found: list[str]) -> None:
    """`found`: the descriptions of the ops outside the allow-list (audit.AuditedOp.describe)."""
    if not found:
        return
    lines = [f"{FILE}: ModelNew.forward ran {len(found)} operator(s) outside the allow-list "
             f"(allocation, creation, views, metadata):"]
    lines += [f"  {op}" for op in found[:10]]
    if len(found) > 10:
        lines.append(f"  ... and {len(found) - 10} more")
    lines.append("the custom path must compute with cuda_extension kernels, not torch operators "
                 "(extend the allow-list with cudaopt_allow_ops if an op is only bookkeeping)")
    raise GuardFailure("op audit", "\n".join(lines))


def check_deterministic(first: Any, second: Any, nondeterministic: bool, atol: float, rtol: float) -> None:
    """Two candidate runs on the same inputs must be bit-identical; within the tolerance
    when model_new.py declares CUDAOPT_NONDETERMINISTIC = True."""
    if nondeterministic:
        result = compare.compare_outputs(second, first, atol=atol, rtol=rtol)
        if not result.passed:
            raise GuardFailure("nondeterministic", (
                f"{FILE}: two runs of ModelNew on the same inputs differ beyond the tolerance "
                f"(declared CUDAOPT_NONDETERMINISTIC, so bitwise differences are allowed):\n{result.table()}"))
        return
    for (path, a), (_, b) in zip(leaves(first), leaves(second)):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            raise GuardFailure("nondeterministic", (
                f"{FILE}: two runs of ModelNew on the same inputs returned {describe_tensor(a)} "
                f"and {describe_tensor(b)} as {path}"))
        count, index, va, vb = compare.first_difference(a, b)
        if count:
            raise GuardFailure("nondeterministic", (
                f"{FILE}: two runs of ModelNew on the same inputs differ in {count} of {a.numel()} elements "
                f"of {path} (first at {list(index)}: {va!r} then {vb!r}); a race or a read of "
                f"uninitialised memory? If the kernels are non-deterministic by design (atomics), declare "
                f"CUDAOPT_NONDETERMINISTIC = True in {FILE} to compare the runs within the tolerance"))


@dataclass
class CaseOutcome:
    comparison: compare.Comparison
    precision: Precision
    family: str = "model"   # the value family judged (values.py)
    skipped: str = ""       # why the family asked for was skipped (then judged on model.py's values)


@dataclass
class Trial:
    """What a case needs besides its inputs: the models, the workdir, the tolerance."""

    model: torch.nn.Module
    model_new: Candidate
    model64: torch.nn.Module | None
    workdir: Path
    device: torch.device
    atol: float
    rtol: float
    max_rel_error: float = 1e-2
    nondeterministic: bool = False
    extra_allowed: frozenset[str] = frozenset()
    input_names: list[str] | None = None
    work_bytes: int = 0    # the reference's intermediates at their peak (MetaCheck.work_bytes), for its float64 run
    # A value-family case's comparison and precision (family.judge); None: model.py's own values.
    judge_family: Callable[..., tuple[compare.Comparison, Precision]] | None = None


def own_outputs(output: Any, inputs: list, names: list[str] | None = None) -> Any:
    """The worker's output, checked (plain tensors, none sharing an input's storage) and copied here: the copy
    is judged, whatever the worker does with its memory later."""
    input_spans = [(i, _storage_span(x)) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    for path, leaf in leaves(output):
        if not isinstance(leaf, torch.Tensor):
            continue
        if type(leaf) is not torch.Tensor:
            raise GuardFailure("output type", (
                f"{FILE}: ModelNew.forward returned a {type(leaf).__module__}.{type(leaf).__qualname__} as {path}; "
                f"outputs must be plain torch.Tensor objects"))
        span = _storage_span(leaf)
        for i, other in input_spans:
            if _overlaps(span, other):
                raise GuardFailure("output aliases input", (
                    f"{FILE}: {path} {describe_tensor(leaf)} shares storage with (is or views) "
                    f"{input_label(i, names)}; outputs must own fresh storage, not return an input or a view of one"))
    return clone_nest(output)


def for_candidate(trial: Trial, inputs: list) -> list:
    """The candidate's working copy of the inputs, in its sharing scope (a worker's pool)."""
    with trial.model_new.sharing():
        return clone_inputs(inputs)


def run_candidate(trial: Trial, inputs: list) -> Any:
    """The candidate's call (`Candidate.checked_call`), its output checked and owned here."""
    try:
        reply = trial.model_new.checked_call(inputs, trial.extra_allowed, trial.input_names)
    except WorkerError as exc:
        if exc.fault:
            raise CudaFault(str(exc)) from None
        if exc.oom:
            raise CandidateError(str(exc)) from torch.OutOfMemoryError(exc.oom)
        raise CandidateError(str(exc), exc.file if exc.kind == "workdir" else None) from None
    except WorkerFailed as exc:
        raise WorkerCrash(exc.headline, exc.words) from None
    output = reply.get("output")
    check_audit(list(reply.get("audit") or ()))
    guard = reply.get("guard")
    if guard:
        raise GuardFailure(str(guard[0]), str(guard[1]))
    owned = own_outputs(output, inputs, trial.input_names)
    del output, reply
    return owned


def _raise_user_error(exc: Exception, workdir: Path, what: str, kind: type) -> None:
    from pytest_cudaopt.workdir import user_traceback

    text = f"{what} raised:\n{user_traceback(exc, [workdir])}"
    if is_cuda_fault(exc) and not context_alive():  # the probe decides, not the error's type
        raise CudaFault(text) from exc
    raise kind(text) from exc


def run_case(trial: Trial, inputs: list) -> CaseOutcome:
    """One case through every guard in order (the first that fails raises GuardFailure)."""
    names = trial.input_names
    pristine = clone_inputs(inputs)
    state = {name: t.detach().clone() for name, t in trial.model_new.state_dict().items()
             if isinstance(t, torch.Tensor)}

    first_inputs = for_candidate(trial, inputs)
    first = run_candidate(trial, first_inputs)
    check_inputs_unchanged(pristine, first_inputs, names)
    check_state_unchanged(state, trial.model_new)
    del first_inputs  # memory in proportion to the problem: one working copy at a time

    try:
        with torch.no_grad(), harness_step("running the reference (model.py)"):
            expected = trial.model(*clone_inputs(inputs))
            if trial.device.type == "cuda":
                torch.cuda.synchronize(trial.device)
    except Exception as exc:
        _raise_user_error(exc, trial.workdir, "Model.forward (model.py)", ReferenceError_)

    second_inputs = for_candidate(trial, inputs)
    second = run_candidate(trial, second_inputs)
    check_inputs_unchanged(pristine, second_inputs, names)
    del second_inputs, pristine
    check_deterministic(first, second, trial.nondeterministic, trial.atol, trial.rtol)
    del second

    with harness_step("comparing the outputs"):
        if trial.judge_family is not None:
            comparison, precision = trial.judge_family(trial, inputs, first, expected)
        else:
            comparison = compare.compare_outputs(first, expected, atol=trial.atol, rtol=trial.rtol)
    if trial.judge_family is None:
        check_comparison(comparison)
        precision = _precision(trial, inputs, first, expected)
    vacuous = comparison.vacuous
    if vacuous:
        note = (f"atol {comparison.atol:g} >= max|expected| for {', '.join(vacuous)}: the element-wise "
                f"tolerance is vacuous there, the relative L2 bound decides")
        precision.note = f"{precision.note}; {note}" if precision.note else note
        precision.vacuous = True
    if precision.wrong:
        raise GuardFailure("wrong", (
            f"{FILE}: ModelNew's output is wrong: relative L2 error vs the float64 reference "
            f"{precision.candidate_error:.3g} > {precision.bound:.3g} (cudaopt_max_rel_error; "
            f"the float32 reference's own error is {precision.reference_error:.3g}), although every "
            f"element is within atol={comparison.atol:g}, rtol={trial.rtol:g}"
            + (f"\n{precision.note}" if precision.note else "")
            + f"\nmax abs err {comparison.max_abs:.3g}, max rel err {comparison.max_rel:.3g}"), comparison, precision)
    return CaseOutcome(comparison, precision)


def check_comparison(comparison: compare.Comparison, extra: str = "") -> None:
    """Raise the mismatch failure of a comparison that did not pass (`extra` ends its message)."""
    if comparison.passed:
        return
    hint = ""
    if comparison.nan_mismatched:
        hint = ("\nNaN where the reference has a value: output elements the candidate never wrote "
                "(memory is filled with NaN before each call), or a NaN it computed")
    raise GuardFailure("mismatch", f"model_new.py: ModelNew's output differs from Model's (model.py):\n"
                                   f"{comparison.table()}{hint}{extra}", comparison)


def float64_reference(trial: Trial, inputs: list, expected: Any) -> tuple[Any, str]:
    """`run_float64` of the trial's reference; a CUDA error that loses the context is a CudaFault."""
    try:
        return run_float64(trial.model, inputs, expected, trial.device, trial.model64, trial.work_bytes)
    except Exception as exc:  # the float64 run lost the CUDA context
        raise CudaFault(f"Model.forward in float64 raised: {exc}") from exc


def _precision(trial: Trial, inputs: list, candidate_out: Any, expected: Any) -> Precision:
    """The candidate's precision against a float64 run of the reference (else the float32 one)."""
    with harness_step("running the float64 reference and measuring the precision"):
        reference64, why = float64_reference(trial, inputs, expected)
        if reference64 is None:
            return Precision.against_float32(candidate_out, expected,
                                             f"{why}; relative L2 error judged against the float32 reference",
                                             trial.max_rel_error)
        return Precision.measure(candidate_out, expected, reference64, trial.max_rel_error)


def input_names(forward: Callable) -> list[str] | None:
    """The names of forward's parameters, for messages ("input 0 (x)")."""
    import inspect

    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
