"""The speed verdict's items: eager, torch.compile, peers and the custom path timed by one engine, then gated."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from pytest_cudaopt import baselines, memory, report, timing, trace

# pytest-benchmark rounds of the custom path (bounded: the engine's medians are the verdict).
BENCHMARK_ROUNDS = (5, 200)


def _derive_seed(session_seed: int, *parts: Any) -> int:
    from pytest_cudaopt.guards import derive_seed

    return derive_seed(session_seed, *parts)


def _compare(settings: Any):
    from pytest_cudaopt.compare import compare_outputs

    def check(output: Any, expected: Any) -> str | None:
        result = compare_outputs(output, expected, atol=settings.atol, rtol=settings.rtol)
        return None if result.passed else result.table()

    return check


def _tier(model: torch.nn.Module, candidate: Any, inputs: list,
          scope: Any = None) -> tuple[str, str]:
    """(tier, note) of a contender's precision, measured against a float64 reference
    (the contender runs inside its scope, e.g. with TF32 allowed)."""
    from pytest_cudaopt.compare import measure_precision

    def call(*args: Any) -> Any:
        if scope is None:
            return candidate(*args)
        with scope():
            return candidate(*args)

    try:
        with baselines.fp32_strict():
            precision = measure_precision(model, call, inputs)
    except Exception as exc:
        return "unknown", f"not measured: {type(exc).__name__}: {exc}"
    return precision.tier, precision.describe()


def _is_fault(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    from pytest_cudaopt.faults import context_lost

    return context_lost(exc)


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


def judge(*, workdir: Any, settings: Any, seed: int, clock: Any, test: str,
          tracer: Any = None, target: Any = None) -> tuple[report.PerfResult, dict]:
    """Time every contender of `workdir`, trace one call of each (with `tracer`, if any)
    and decide the gate. Returns the result and what the pytest-benchmark recording needs
    (the custom model and the input sets). `target` is the loaded baseline workdir (the
    target branch), or the error that loading it raised."""
    device = torch.device(settings.device)
    peak = memory.Peak(device).__enter__()
    model, model_new = workdir.make_models(device, seed=_derive_seed(seed, "perf", "weights"))
    input_sets = [workdir.inputs(_derive_seed(seed, "perf", "inputs", 0), device)]
    with baselines.fp32_strict():
        expected = [model(*timing.clone_inputs(input_sets[0]))]
    # As many input sets as the case budget holds (at least 2): each set once here with its
    # expected output, and once per contender in the timing loop unless that would not fit.
    count, share_inputs, sets_note = memory.perf_input_plan(
        settings.input_sets, memory.nbytes(input_sets[0]), memory.nbytes(expected[0]), memory.free_bytes(device))
    for i in range(1, count):
        input_sets.append(workdir.inputs(_derive_seed(seed, "perf", "inputs", i), device))
        with baselines.fp32_strict():
            expected.append(model(*timing.clone_inputs(input_sets[-1])))
    tier, note = _tier(model, model_new, input_sets[0])
    precision_matched = baselines.below_fp32(tier) or settings.gate == "precision-matched"
    lineup = baselines.lineup(
        model, model_new, timing.clone_inputs(input_sets[0]), device,
        compile_mode=settings.compile_mode, compile_backend=settings.compile_backend,
        precision_matched=precision_matched, workdir=workdir.path,
        reference_module=workdir.reference, init_inputs=workdir.init_inputs(),
        target=_target_model(target, model, device, _derive_seed(seed, "perf", "weights")))
    # Eager Model is the float32 reference; every other contender's tier is measured.
    tiers = {baselines.EAGER: baselines.FP32, baselines.CUSTOM: tier}
    for contender in lineup.contenders:
        if contender.key not in tiers:
            tiers[contender.key] = _tier(model, contender.fn, input_sets[0], contender.scope)[0]
    config = timing.Config.from_settings(settings, seed=_derive_seed(seed, "perf", "checks"),
                                         share_inputs=share_inputs)
    measurement = timing.measure(lineup.contenders, input_sets, clock=clock, config=config,
                                 expected=expected, compare=_compare(settings))
    traces: dict[str, trace.Trace] = {}
    if tracer is not None:
        # After the timing, so that the profiler (its first use in a process costs about a
        # second) cannot touch the medians.
        timed = [c for c in lineup.contenders if measurement.results[c.key].error is None
                 and measurement.results[c.key].samples]
        leads = {c.key: measurement.results[c.key].latency_summary.median for c in timed}
        traces = trace.trace_lineup(timed, input_sets[0], tracer, leads)
        for key, found in traces.items():
            escaped = trace.escape_failure(found)
            if escaped:
                measurement.results[key].fail(escaped)
    failures = {k: r.failure for k, r in measurement.results.items() if r.failure}
    failures.update(lineup.errors)
    medians = {k: r.summary.median for k, r in measurement.results.items() if r.samples}
    gate = report.gate_verdict(medians, failures, gate=settings.gate, min_speedup=settings.min_speedup)
    result = report.PerfResult(
        workdir=str(workdir.path), test=test, gate=gate, measurement=measurement,
        labels={c.key: c.label for c in lineup.contenders}, tiers=tiers,
        precision_note=f"{note}; {sets_note}" if sets_note else note,
        compile_seconds=lineup.compile_seconds, errors=lineup.errors,
        environment=report.environment(), traces=traces)
    result.regression = report.regression_verdict(medians, margin=settings.regression_margin)
    if result.regression and not result.regression["passed"]:
        result.failure = (f"slower than the target branch's ModelNew by "
                          f"{(result.regression['ratio'] - 1) * 100:.1f}% (margin "
                          f"{settings.regression_margin * 100:g}%)")
    peak.__exit__(None, None, None)
    result.peak_bytes = peak.bytes
    return result, {"model_new": model_new, "input_sets": input_sets, "device": device}


def record_benchmark(benchmark: Any, result: report.PerfResult, clock: Any,
                     model_new: Any, input_sets: list, device: torch.device) -> None:
    """Time the custom path once more through pytest-benchmark's `benchmark` fixture, for
    --benchmark-autosave / --benchmark-compare. Each round: input set rotated, cache flushed,
    device idle (setup, untimed); then the call and a device-wide synchronise (timed), so
    the numbers are host time to completion. No-op without pytest-benchmark (None)."""
    if benchmark is None:
        return
    benchmark.extra_info.update(result.extra_info())
    custom = result.measurement.results.get(baselines.CUSTOM) if result.measurement else None
    if custom is None or custom.failure or not custom.samples:
        benchmark.skipped = True  # nothing worth recording (and no "fixture not used" warning)
        return
    sets = [timing.clone_inputs(s) for s in input_sets]
    order = itertools.cycle(range(len(sets)))
    flush = getattr(clock, "flush", None)

    def setup():
        baselines.synchronize(device)
        if callable(flush):
            flush()
        baselines.synchronize(device)
        return (sets[next(order)],), {}

    def target(args):
        output = model_new(*args)
        baselines.synchronize(device)
        return output

    low, high = BENCHMARK_ROUNDS
    rounds = max(low, min(high, len(custom.samples)))
    benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=2)


@pytest.mark.perf
# An item that fails before timing (the workdir did not build or load) leaves the fixture unused.
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used at all in this test")
class TestPerf:
    """`pytest -m perf`: the custom path must beat torch.compile by `cudaopt_min_speedup`."""

    def test_speedup(self, request, cudaopt_session, cudaopt_settings, cudaopt_workdir_path,
                     cuda_extension, cudaopt_perf_clock, cudaopt_perf_tracer, benchmark):
        if cudaopt_session.fault is not None:
            where, message = cudaopt_session.fault
            pytest.fail(f"not timed: an earlier CUDA fault in {where} left this process's CUDA "
                        f"context unusable: {message}", pytrace=False)
        changed = timing.tampered()
        if changed:
            pytest.fail(f"{cudaopt_workdir_path / 'model_new.py'} (or code it imports) replaced "
                        f"{', '.join(changed)}; the speed verdict does not trust a patched clock",
                        pytrace=False)
        from pytest_cudaopt.build import BuildError
        from pytest_cudaopt.workdir import WorkdirError

        # The clock and the tracer decide the verdict: a conftest.py's override is refused
        # outside self-tests.
        clock = cudaopt_session.verdict_fixture(request, "cudaopt_perf_clock")
        clock = clock or timing.default_clock(cudaopt_settings.device, cuda_graph=cudaopt_settings.cuda_graph)
        tracer = None
        if cudaopt_settings.trace:
            tracer = cudaopt_session.verdict_fixture(request, "cudaopt_perf_tracer")
            tracer = tracer or trace.default_tracer(cudaopt_settings.device)
        with torch.no_grad():
            failure = ""
            try:
                workdir = cudaopt_session.workdir(cudaopt_workdir_path)
                result, extra = judge(workdir=workdir, settings=cudaopt_settings, seed=cudaopt_session.seed,
                                      clock=clock, test=request.node.nodeid, tracer=tracer,
                                      target=cudaopt_session.target_workdir())
            except (BuildError, WorkdirError) as exc:
                failure = cudaopt_session.failure_report(cudaopt_workdir_path, request.node.nodeid, exc)
            if failure:  # outside the except block: one report, no "During handling ..." chain
                pytest.fail(failure, pytrace=False)
            changed = timing.tampered()
            if changed:
                result.failure = (f"the timing functions {', '.join(changed)} were replaced while "
                                  "the contenders ran")
            cudaopt_session.results.append(result)
            for contender in result.measurement.results.values():
                if _is_fault(contender.error) and cudaopt_session.fault is None:
                    cudaopt_session.fault = (request.node.nodeid, contender.failure)
            record_benchmark(benchmark, result, clock, **extra)
        if not result.passed:
            pytest.fail(result.table(), pytrace=False)
