"""The speed verdict: eager, torch.compile, peers and the custom path timed by one engine on the same inputs, traced, then gated."""

from __future__ import annotations

from typing import Any

import torch

from pytest_cudaopt import memory
from pytest_cudaopt.environment import environment
from pytest_cudaopt.isolation import GRAD_MODE
from pytest_cudaopt.correctness.compare import compare_outputs
from pytest_cudaopt.correctness.guards import derive_seed
from pytest_cudaopt.correctness.precision import FP32, UNKNOWN, below_fp32, measure_precision
from pytest_cudaopt.perf import engine, gate, lineup, trace
from pytest_cudaopt.results import PerfResult
from pytest_cudaopt.tensors import clone_inputs, nbytes


def _compare(settings: Any):
    def check(output: Any, expected: Any) -> str | None:
        result = compare_outputs(output, expected, atol=settings.atol, rtol=settings.rtol)
        return None if result.passed else result.table()

    return check


def _tier(model: torch.nn.Module, candidate: Any, inputs: list, scope: Any = None) -> tuple[str, str]:
    """(tier, note) of a contender's precision, measured against a float64 reference
    (the contender runs inside its scope, e.g. with TF32 allowed)."""
    def call(*args: Any) -> Any:
        if scope is None:
            return candidate(*args)
        with scope():
            return candidate(*args)

    try:
        with lineup.fp32_strict():
            precision = measure_precision(model, call, inputs)
    except Exception as exc:
        return UNKNOWN, f"not measured: {type(exc).__name__}: {exc}"
    return precision.tier, precision.describe()


def _target_model(target: Any, model: torch.nn.Module, device: torch.device, seed: int) -> Any:
    """The target branch's ModelNew with Model's weights, or why it cannot be built (a
    broken target branch is reported, not held against the candidate)."""
    if target is None:
        return None
    if isinstance(target, BaseException):
        return f"the baseline workdir cannot be loaded: {str(target).strip().splitlines()[0]}"
    try:
        _, target_new = target.make_models(device, seed=seed)
        target_new.load_state_dict(model.state_dict(), strict=True)
    except Exception as exc:
        return f"the baseline workdir's ModelNew cannot be built: {type(exc).__name__}: {exc}"
    return target_new


def _input_sets(workdir: Any, model: torch.nn.Module, settings: Any, seed: int,
                device: torch.device) -> tuple[list, list, bool, str]:
    """As many input sets as the case budget holds (at least 2), each with the reference's
    output: (input sets, expected outputs, shared by the contenders, note)."""
    input_sets = [workdir.inputs(derive_seed(seed, "perf", "inputs", 0), device)]
    with lineup.fp32_strict():
        expected = [model(*clone_inputs(input_sets[0]))]
    count, share_inputs, note = memory.perf_input_plan(
        settings.input_sets, nbytes(input_sets[0]), nbytes(expected[0]), memory.free_bytes(device))
    for i in range(1, count):
        input_sets.append(workdir.inputs(derive_seed(seed, "perf", "inputs", i), device))
        with lineup.fp32_strict():
            expected.append(model(*clone_inputs(input_sets[-1])))
    return input_sets, expected, share_inputs, note


def _traces(lineup_: lineup.Lineup, measurement: engine.Measurement, args: list, tracer: Any) -> dict:
    """One traced call of every contender that was timed, after the timing (the profiler's
    first use in a process costs about a second and cannot touch the medians); a trace that
    shows escaped work fails its contender."""
    if tracer is None:
        return {}
    timed = [c for c in lineup_.contenders if measurement.results[c.key].error is None
             and measurement.results[c.key].samples]
    leads = {c.key: measurement.results[c.key].latency_summary.median for c in timed}
    traces = trace.trace_lineup(timed, args, tracer, leads)
    for key, found in traces.items():
        escaped = trace.escape_failure(found)
        if escaped:
            measurement.results[key].fail(escaped)
    return traces


def _verifier(watch: Any, workdir: Any) -> Any:
    """Verify torch's namespaces, flags and dispatcher (isolation.Watch) at the points where
    candidate code has run and the baselines are to run; the first failure is kept."""
    context = {GRAD_MODE: torch.is_grad_enabled()}  # the caller's no_grad(), not the candidate's
    found: list[str] = []

    def verify(phase: str, full: bool = True) -> list[str]:
        if watch is not None and not found:
            failure = watch.verify(phase, workdir.path, context=context, full=full)
            if failure:
                found.append(failure)
        return found
    return verify


def judge(*, workdir: Any, settings: Any, seed: int, clock: Any, test: str,
          tracer: Any = None, target: Any = None, watch: Any = None) -> tuple[PerfResult, dict]:
    """Time every contender of `workdir`, trace one call of each (with `tracer`, if any)
    and decide the gate. Returns the result and what the pytest-benchmark recording needs
    (the custom model and the input sets). `target` is the loaded baseline workdir (the
    target branch), or the error that loading it raised; `watch` the session's
    isolation.Watch, which must find torch unchanged after the candidate's code ran."""
    device = torch.device(settings.device)
    verify = _verifier(watch, workdir)
    with memory.Peak(device) as peak:
        model, model_new = workdir.make_models(device, seed=derive_seed(seed, "perf", "weights"))
        verify("found after ModelNew(...) was built, before the reference ran", full=False)
        input_sets, expected, share_inputs, sets_note = _input_sets(workdir, model, settings, seed, device)
        tier, note = _tier(model, model_new, input_sets[0])
        verify("found after ModelNew's first calls, before the baselines were compiled")
        precision_matched = below_fp32(tier) or settings.gate == "precision-matched"
        line = lineup.lineup(
            model, model_new, clone_inputs(input_sets[0]), device,
            compile_mode=settings.compile_mode, compile_backend=settings.compile_backend,
            precision_matched=precision_matched, workdir=workdir.path,
            reference_module=workdir.reference, init_inputs=workdir.init_inputs(),
            target=_target_model(target, model, device, derive_seed(seed, "perf", "weights")))
        # Eager Model is the float32 reference; every other contender's tier is measured.
        tiers = {lineup.EAGER: FP32, lineup.CUSTOM: tier}
        for contender in line.contenders:
            if contender.key not in tiers:
                tiers[contender.key] = _tier(model, contender.fn, input_sets[0], contender.scope)[0]
        config = engine.Config.from_settings(settings, seed=derive_seed(seed, "perf", "checks"),
                                             share_inputs=share_inputs)
        measurement = engine.measure(line.contenders, input_sets, clock=clock, config=config,
                                     expected=expected, compare=_compare(settings))
        traces = _traces(line, measurement, input_sets[0], tracer)
        breach = verify("found after the contenders were timed and traced")
    result = _result(workdir, test, settings, measurement, line, tiers, traces,
                     f"{note}; {sets_note}" if sets_note else note)
    result.peak_bytes = peak.bytes
    if breach:  # the baselines (or the expected outputs) ran changed: no figure above counts
        result.failure = breach[0]
    return result, {"model_new": model_new, "input_sets": input_sets, "device": device}


def _result(workdir: Any, test: str, settings: Any, measurement: engine.Measurement, line: lineup.Lineup,
            tiers: dict[str, str], traces: dict, note: str) -> PerfResult:
    """The gate, the regression check and the figure warnings of a measurement."""
    failures = {k: r.failure for k, r in measurement.results.items() if r.failure}
    failures.update(line.errors)
    medians = {k: r.summary.median for k, r in measurement.results.items() if r.samples}
    result = PerfResult(
        workdir=str(workdir.path), test=test,
        gate=gate.gate_verdict(medians, failures, gate=settings.gate, min_speedup=settings.min_speedup),
        measurement=measurement, labels={c.key: c.label for c in line.contenders}, tiers=tiers,
        precision_note=note, compile_seconds=line.compile_seconds, errors=line.errors,
        environment=environment(), traces=traces)
    result.regression = gate.regression_verdict(medians, margin=settings.regression_margin)
    if result.regression and not result.regression["passed"]:
        result.failure = (f"slower than the target branch's ModelNew by "
                          f"{(result.regression['ratio'] - 1) * 100:.1f}% (margin "
                          f"{settings.regression_margin * 100:g}%)")
    result.figure_warnings = gate.candidate_warnings(measurement, result.kernel_sum(lineup.CUSTOM))
    return result
