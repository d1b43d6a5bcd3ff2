"""The speed items: `pytest -m perf`, judged by `pytest_cudaopt.perf.verdict`, and recorded through pytest-benchmark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_cudaopt.results import blame, report
from pytest_cudaopt.perf import clocks, lineup, trace
from pytest_cudaopt.perf.feed import Feed
from pytest_cudaopt.perf.verdict import arrange, judge, prepare
from pytest_cudaopt.results.records import PerfResult
from pytest_cudaopt.run import turn, watchdog
from pytest_cudaopt.workdir import saved_rng

# pytest-benchmark rounds of the custom path (bounded: the engine's medians are the verdict).
BENCHMARK_ROUNDS = (5, 200)


def record_benchmark(benchmark: Any, result: PerfResult, clock: Any,
                     model_new: Any, feed: Feed, device: torch.device) -> None:
    """Time the custom path once more through pytest-benchmark's `benchmark` fixture (None: no-op):
    each round a fresh input set and a flushed cache untimed, then the call and a synchronise."""
    if benchmark is None:
        return
    benchmark.extra_info.update(report.benchmark_extra_info(result))
    custom = result.measurement.results.get(lineup.CUSTOM) if result.measurement else None
    if custom is None or custom.failure or not custom.samples:
        benchmark.skipped = True  # nothing worth recording (and no "fixture not used" warning)
        return
    flush = getattr(clock, "flush", None)

    def setup():
        _, inputs = feed.next()
        lineup.synchronize(device)
        if callable(flush):
            flush()
        lineup.synchronize(device)
        return (inputs,), {}

    def target(args):
        output = model_new(*args)
        lineup.synchronize(device)
        return output

    low, high = BENCHMARK_ROUNDS
    rounds = max(low, min(high, len(custom.samples)))
    with saved_rng():  # the feed's draws seed the global generators
        benchmark.pedantic(target, setup=setup, rounds=rounds, warmup_rounds=2)


def judged_precisions(results: list, path: Any, report: str | None = None) -> list[tuple[str, Any]]:
    """(case, Precision) of every correctness result of this session for the workdir at `path`, and of the JSON
    report `report` (`correctness_report`: `cudaopt judge` names its check stage's, so that its perf stage finds the
    workdir's tier a whole pytest session finds, and times the same baselines)."""
    found = [(r.case, r.precision) for r in results if getattr(r, "kind", "") == "correctness"
             and getattr(r, "workdir", None) == str(path) and getattr(r, "precision", None) is not None]
    return found + (reported_precisions(report) if report else [])


def reported_precisions(path: str) -> list[tuple[str, Any]]:
    """(case, Precision) of every correctness result of the JSON report at `path`."""
    from pytest_cudaopt.correctness.precision import Precision

    try:
        results = json.loads(Path(path).read_text()).get("results", [])
        return [(str(r["data"]["case"]), Precision.from_json(r["data"]["precision"])) for r in results
                if r.get("kind") == "correctness" and r.get("data", {}).get("precision")]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RuntimeError(f"cudaopt_correctness_report: {path} is not a readable cudaopt JSON report: "
                           f"{type(exc).__name__}: {exc}") from exc


def gate_shortfall(model_new: Any, workdir: Any, settings: Any) -> tuple[str, str] | None:
    """(blame, why) when ModelNew's figures could not be checked because its timing gate found no device memory,
    else None. The gate is set up before the workdir loads: its shortfall is the other holders' (a neighbour's
    hog: judged again), unless ModelNew's process holds more than its case allows by now."""
    from pytest_cudaopt.correctness.case import holder
    from pytest_cudaopt.primitives.memory import OVERHEAD

    error = getattr(getattr(model_new, "worker", None), "stream_gate_error", None) or ""
    if "out of memory" not in error or not model_new.timing_failure():
        return None
    who, why = holder(workdir, settings, OVERHEAD, OVERHEAD)
    return who, f"its timing gate was not set up: {error.splitlines()[0]}" + (f"; {why}" if why else "")


def failed_correctness(results: list, path: Any) -> str:
    """The first failed correctness item of this session for the workdir at `path`, or ""."""
    where = Path(path).resolve()
    for r in results:
        if getattr(r, "kind", "") == "correctness" and not r.passed and Path(r.workdir).resolve() == where:
            first = (r.message or r.check or "failed").strip().splitlines()[0]
            return f"{r.test}: {first}"
    return ""


@pytest.mark.perf
# An item that fails before timing (the workdir did not build or load) leaves the fixture unused.
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used at all in this test")
class TestPerf:
    """The custom path must beat torch.compile by `cudaopt_min_speedup`."""

    def test_speedup(self, request, cudaopt_session, cudaopt_settings, cudaopt_workdir_path, benchmark):
        changed = clocks.tampered()
        if changed:
            pytest.fail(f"{cudaopt_workdir_path / 'model_new.py'} (or code it imports) replaced "
                        f"{', '.join(changed)}; the speed verdict does not trust a patched clock", pytrace=False)
        wrong = failed_correctness(cudaopt_session.results, cudaopt_workdir_path)
        if wrong:  # a speedup of a wrong function means nothing: none is timed or printed
            pytest.fail(f"not run: correctness failed ({wrong})", pytrace=False)
        device = cudaopt_settings.device
        tracer = None
        if cudaopt_settings.trace:
            tracer = (cudaopt_session.verdict_hook(request.node, "pytest_cudaopt_perf_tracer", device=device)
                      or trace.default_tracer(device))
        arranged = None
        if turn.pending():  # a judge's perf child: all but the timing is made before its turn, beside other stages
            # paused between its steps for another workdir's turn (turn.pause_within), as a check between its cases
            reference = cudaopt_session.reference(cudaopt_workdir_path)
            with torch.no_grad(), lineup.quiet_compile_log():
                prepared = prepare(reference, cudaopt_settings, cudaopt_session.seed, tracer) if reference else None
            turn.pause_within()
            cudaopt_session.workers.make_context(cudaopt_workdir_path)   # its worker's context: not in the turn
            workdir = cudaopt_session.loaded_or_fail(cudaopt_workdir_path, request.node.nodeid, "run")
            known = judged_precisions(cudaopt_session.results, workdir.path, cudaopt_settings.correctness_report)
            turn.pause_within()
            with torch.no_grad(), lineup.quiet_compile_log():
                arranged = arrange(workdir=workdir, settings=cudaopt_settings, seed=cudaopt_session.seed,
                                   target=cudaopt_session.target_workdir(), prepared=prepared, known=known,
                                   between=turn.pause_within)
            # its workers stopped while it waits: no candidate code runs beside another workdir's turn
            with watchdog.harness_step("waiting for the device to itself (the judge's other stages on it)"):
                cudaopt_session.workers.hold(True)
                try:
                    turn.wait()
                finally:
                    cudaopt_session.workers.hold(False)
        else:
            workdir = cudaopt_session.loaded_or_fail(cudaopt_workdir_path, request.node.nodeid, "run")
            known = judged_precisions(cudaopt_session.results, workdir.path, cudaopt_settings.correctness_report)
        clock = (cudaopt_session.verdict_hook(request.node, "pytest_cudaopt_perf_clock", device=device)
                 or clocks.default_clock(device, cuda_graph=cudaopt_settings.cuda_graph))
        with torch.no_grad(), lineup.quiet_compile_log():
            result, extra = judge(workdir=workdir, settings=cudaopt_settings, seed=cudaopt_session.seed,
                                  clock=clock, test=request.node.nodeid, tracer=tracer,
                                  target=cudaopt_session.target_workdir(), arranged=arranged, known=known)
            changed = clocks.tampered()
            if changed:
                result.failure = (f"the timing functions {', '.join(changed)} were replaced while "
                                  "the contenders ran")
            cudaopt_session.results.append(result)
            for contender in result.measurement.results.values():
                cudaopt_session.note_fault(request.node.nodeid, contender.error, contender.failure)
            record_benchmark(benchmark, result, clock, **extra)
        if not result.passed:  # the reason first: the summary, JUnit and the judge show the first line
            short = gate_shortfall(extra["model_new"], workdir, cudaopt_settings)
            if short is not None:
                blame.assign(request.node, short[0])
            why = f"\n{short[1]}" if short is not None else ""
            pytest.fail(f"{result.reason}{why}\n{report.perf_table(result)}", pytrace=False)
