"""The speed verdict: eager, torch.compile, peers and the custom path timed by one engine, every call on inputs no earlier call saw, traced, then gated."""

from __future__ import annotations

import math
import re
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from pytest_cudaopt.primitives import memory
from pytest_cudaopt.primitives.environment import environment
from pytest_cudaopt.correctness.compare import compare_outputs
from pytest_cudaopt.correctness.guards import derive_seed
from pytest_cudaopt.correctness.precision import FP32, TIER_ORDER, UNKNOWN, WRONG, Precision, below_fp32, pooled, \
    measure_precision
from pytest_cudaopt.perf import engine, decision as gate, lineup, timed_precision, trace
from pytest_cudaopt.perf.feed import Feed
from pytest_cudaopt.results.records import PerfResult
from pytest_cudaopt.primitives.tensors import clone_inputs, float_elements, nbytes
from pytest_cudaopt.workdir import WorkdirError, saved_rng
from pytest_cudaopt.remote.candidate import Candidate


def _compare(settings: Any, timed: timed_precision.TimedErrors):
    def check(output: Any, expected: Any, key: str) -> str | None:
        result = compare_outputs(output, expected, atol=settings.atol, rtol=settings.rtol)
        timed.add(key, result)
        return None if result.passed else result.table()

    return check


def _measure(model: torch.nn.Module, candidate: Any, inputs: list, scope: Any = None) -> Precision:
    """A contender's precision (inside its scope) against a float64 reference."""
    def call(*args: Any) -> Any:
        with (scope or nullcontext)():
            return candidate(*args)

    with lineup.fp32_strict():
        return measure_precision(model, call, inputs)


def _tier(model: torch.nn.Module, candidate: Any, inputs: list, scope: Any = None) -> tuple[str, str]:
    """(tier, note) of a contender's precision against a float64 reference."""
    try:
        precision = _measure(model, candidate, inputs, scope)
    except Exception as exc:
        return UNKNOWN, f"not measured: {type(exc).__name__}: {exc}"
    return precision.tier, precision.describe()


def _custom_precision(model: torch.nn.Module, model_new: Any, feed: Feed, example: list,
                      elements: int) -> tuple[Precision, str]:
    """ModelNew's untimed precision, over enough input sets for a steady figure (precision.pooled), and its note.
    Its calls are correctness calls (`checked_call`), which its worker cannot tell from the correctness items': what
    the timed outputs are held to (timed_precision.bound)."""
    sets = iter([example])

    def checked(*inputs: Any) -> Any:
        return model_new.checked_call(list(inputs), frozenset(), None)["output"]

    try:
        precision = pooled(lambda: _measure(model, checked, next(sets, None) or feed.next()[1]), elements)
    except Exception as exc:
        return Precision(math.nan, math.nan, UNKNOWN), f"not measured: {type(exc).__name__}: {exc}"
    return precision, precision.describe()


def _target_model(target: Any, model: torch.nn.Module, device: torch.device, seed: int) -> Candidate | str | None:
    """The target branch's ModelNew with Model's weights, or why it cannot be built (reported, not held against)."""
    if target is None:
        return None
    if isinstance(target, BaseException):
        return f"the baseline workdir cannot be loaded: {str(target).strip().splitlines()[0]}"
    try:
        target_model, target_new = target.make_models(device, seed=seed)
        target.copy_state(model, target_new)
        del target_model
    except Exception as exc:
        return f"the baseline workdir's ModelNew cannot be built: {type(exc).__name__}: {exc}"
    return target_new


def _workdir_tier(tier: str, note: str, known: Sequence[tuple[str, Any]]) -> tuple[str, str]:
    """The workdir's one precision tier: the least precise of the timed inputs' and of `known`'s (not "wrong")."""
    cases = [(case, p) for case, p in known if p is not None and p.tier in TIER_ORDER and p.tier != WRONG]
    if not cases:
        return tier, note
    case, worst = max(cases, key=lambda cp: (TIER_ORDER.index(cp[1].tier), cp[1].candidate_error))
    if tier in TIER_ORDER and TIER_ORDER.index(tier) >= TIER_ORDER.index(worst.tier):
        return tier, f"{note} (the {len(cases)} correctness results of this workdir are no less precise)"
    return worst.tier, (f"{worst.describe()} on {case}, the least precise of {len(cases)} correctness "
                        f"results of this workdir; on the timed inputs {note}")


def _feed(workdir: Any, model: torch.nn.Module, candidate: Candidate, seed: int, device: torch.device) -> Feed:
    """Input set n: get_inputs() under its own secret seed; the expected output: Model in float32 (TF32 off)."""
    last = [0]   # the bytes of the last input set drawn

    def draw(n: int) -> list:
        # A private pool's own out-of-memory retry frees only that pool's cache: where the next set (and
        # get_inputs()'s temporaries) would not fit beside the default pool's, that one is given back first.
        if device.type == "cuda":
            memory.make_room(device, 2 * last[0])
        # In the candidate's sharing scope (a worker's pool on CUDA: the segments it maps hold inputs only).
        with candidate.sharing():
            inputs = workdir.inputs(derive_seed(seed, "perf", "inputs", n), device, isolated=False)
        last[0] = nbytes(inputs)
        return inputs

    def reference(*inputs: Any) -> Any:
        with lineup.fp32_strict():
            return model(*inputs)

    return Feed(draw, reference)


def _traces(lineup_: lineup.Lineup, measurement: engine.Measurement, args: list, tracer: Any,
            untrusted: str = "") -> dict:
    """One traced call of every contender timed or failed, after the timing; escaped work fails its contender.
    `untrusted`: why ModelNew's figures cannot be believed, which fails the custom path after an escape
    (the more telling reason, given first)."""
    results = measurement.results
    custom = results.get(lineup.CUSTOM)
    # Failed untimed as far slower, that reason comes first: a timer that under-reports its warm-up only hid more.
    if untrusted and custom is not None and custom.untimed:
        custom.failure = f"{custom.failure}; {untrusted}"
    elif untrusted and custom is not None:
        custom.failure = untrusted if custom.failure is None else f"{untrusted}; {custom.failure}"
    if tracer is None:
        return {}
    timed = [c for c in lineup_.contenders if results[c.key].error is None and not results[c.key].untimed
             and (results[c.key].samples or results[c.key].failure)]
    leads = {c.key: results[c.key].latency_summary.median if results[c.key].samples else 0.0 for c in timed}
    traces = trace.trace_lineup(timed, args, tracer, leads)
    for key, found in traces.items():
        escaped = trace.escape_failure(found)
        if escaped:
            failure = results[key].failure
            results[key].failure = escaped if failure is None else f"{escaped}; {failure}"
    return traces


@dataclass
class Prepared:
    """What a judge's perf child makes before its turn (run/turn.py): Model and its fp32 baseline compiled."""

    model: torch.nn.Module
    init: list
    compiled: dict


def prepare(workdir: Any, settings: Any, seed: int, tracer: Any = None) -> Prepared | None:
    """Model built as `judge` builds it, torch.compile(Model) compiled on a draw of its inputs, the tracer's
    profiler started once: no code of the candidate's (what fails here `judge` meets again, and reports)."""
    device = torch.device(settings.device)
    with saved_rng():
        try:
            init, model = workdir.make_reference(device, seed=derive_seed(seed, "perf", "weights"))
        except WorkdirError:
            return None
        compiled = {}
        with suppress(Exception):  # judge compiles again and reports the error
            example = workdir.inputs(derive_seed(seed, "perf", "compile"), device)
            compiled[lineup.COMPILE] = lineup.compile_model(model, example, device, mode=settings.compile_mode,
                                                            backend=settings.compile_backend, name="compiled_fp32")
    if isinstance(tracer, trace.ProfilerTracer):
        tracer.warm()
    return Prepared(model, init, compiled)


@dataclass
class Arranged:
    """What `judge` times, made: Model and ModelNew, the inputs' feed, the contenders and each one's precision
    tier; the example's sizes (the memory plan's) and the peak memory it took. A judge's perf child makes it
    before its turn (run/turn.py): nothing of it is timed."""

    model: torch.nn.Module
    model_new: Any
    feed: Feed
    line: lineup.Lineup
    tiers: dict
    note: str
    sizes: tuple[int, int]
    peak_bytes: int | None
    timed_bound: timed_precision.Bound | None = None   # what ModelNew's timed outputs are held to


def arrange(*, workdir: Any, settings: Any, seed: int, target: Any = None, known: Sequence[tuple[str, Any]] = (),
            prepared: Prepared | None = None, between: Callable[[], None] = lambda: None) -> Arranged:
    """Model and ModelNew built, the contenders lined up (compiled), each one's precision measured: all of
    `judge` but the timing and the traces. `target`: the target branch's workdir or the error loading it.
    `between`: called between its steps, none of its device work in flight (a judge's pause point)."""
    device = torch.device(settings.device)
    weights = derive_seed(seed, "perf", "weights")
    memory.release(device)  # what the session's earlier items left cached: the worker's outputs need it
    with memory.Peak(device) as peak, saved_rng():
        if prepared is not None:
            model = prepared.model
            model_new = workdir.make_candidate(model, prepared.init, device, weights)
        else:
            model, model_new = workdir.make_models(device, seed=weights)
        feed = _feed(workdir, model, model_new, seed, device)
        _, example = feed.next()
        expected = feed.expected(example)
        out_bytes, elements = nbytes(expected), float_elements(expected)
        del expected   # not kept through the compiles below
        precision, note = _custom_precision(model, model_new, feed, example, elements)
        tier, note = _workdir_tier(precision.tier, note, known)
        canonical = [p for case, p in known if re.fullmatch(r"canonical seed\d+", case)]   # model.py's values
        timed_bound = timed_precision.bound(precision, tier, settings.max_rel_error, canonical, elements)
        between()
        # TF32 exists only on CUDA: on the CPU the "+ TF32" baseline would be the fp32 one again.
        precision_matched = (device.type == "cuda" and below_fp32(tier)) or settings.gate == "precision-matched"
        line = lineup.lineup(
            model, model_new, clone_inputs(example), device,
            compile_mode=settings.compile_mode, compile_backend=settings.compile_backend,
            precision_matched=precision_matched, workdir=workdir.path,
            reference_module=workdir.reference, init_inputs=workdir.init_inputs(),
            compiled=prepared.compiled if prepared is not None else None,
            target=_target_model(target, model, device, weights))
        # Eager Model is the float32 reference; every other contender's tier is measured.
        tiers = {lineup.EAGER: FP32, lineup.CUSTOM: tier}
        for contender in line.contenders:
            if contender.key not in tiers:
                between()
                tiers[contender.key] = _tier(model, contender.fn, example, contender.scope)[0]
        sizes = (nbytes(example), out_bytes)
        del example  # every timed call draws its own
    return Arranged(model, model_new, feed, line, tiers, note, sizes, peak.bytes, timed_bound)


def judge(*, workdir: Any, settings: Any, seed: int, clock: Any, test: str, tracer: Any = None, target: Any = None,
          known: Sequence[tuple[str, Any]] = (), prepared: Prepared | None = None,
          arranged: Arranged | None = None) -> tuple[PerfResult, dict]:
    """Time every contender of `workdir`, trace one call of each and decide the gate: the result and what
    the pytest-benchmark recording needs. `arranged`: `arrange`'s, made already (else made here)."""
    device = torch.device(settings.device)
    if arranged is None:
        arranged = arrange(workdir=workdir, settings=settings, seed=seed, target=target, known=known,
                           prepared=prepared)
    model_new, feed, line, tiers, note = arranged.model_new, arranged.feed, arranged.line, arranged.tiers, arranged.note
    with memory.Peak(device) as peak, saved_rng():
        # The memory plan for inputs and outputs the size of the example's, in what the device has free now.
        group, one_check, batch, plan_note = memory.perf_input_plan(
            *arranged.sizes, memory.free_bytes(device), len(line.contenders), engine.Config.max_batch)
        config = engine.Config.from_settings(settings, seed=derive_seed(seed, "perf", "checks"),
                                             queue_group=group, one_check_per_pass=one_check, max_batch=batch,
                                             gate=(lineup.CUSTOM, gate.GATES[settings.gate]))
        timed = timed_precision.TimedErrors({lineup.CUSTOM: arranged.timed_bound} if arranged.timed_bound else {},
                                            baseline=lineup.COMPILE)
        measurement = engine.measure(line.contenders, feed, clock=clock, config=config,
                                     compare=_compare(settings, timed))
        custom, less_precise = measurement.results.get(lineup.CUSTOM), timed.failure(lineup.CUSTOM)
        if custom is not None and less_precise:
            custom.failure = less_precise if custom.failure is None else f"{custom.failure}; {less_precise}"
        traces = _traces(line, measurement, feed.next()[1], tracer, model_new.timing_failure())
    result = _result(workdir, test, settings, measurement, line, tiers, traces,
                     f"{note}; {plan_note}" if plan_note else note)
    result.timed_precision = timed.to_json().get(lineup.CUSTOM)
    result.peak_bytes = max((b for b in (peak.bytes, arranged.peak_bytes) if b is not None), default=None)
    note = model_new.timing_note()
    if note:
        result.figure_warnings.append(note)
    result.clock = model_new.timing_record()
    return result, {"model_new": model_new, "feed": feed, "device": device}


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
