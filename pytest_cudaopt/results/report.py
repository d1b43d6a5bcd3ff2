"""Rendering only: results as records and tables (terminal, Markdown), as pytest-benchmark's extra fields; the JSON report's file is jsonreport.py."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_cudaopt.primitives.environment import environment
from pytest_cudaopt.perf.decision import SpeedDecision
from pytest_cudaopt.perf.lineup import COMPILE, CUSTOM, EAGER, PEER_PREFIX, PRECISION_MATCHED, TARGET
from pytest_cudaopt.perf.stats import format_seconds
from pytest_cudaopt.results.records import (ACCEPTED, CorrectnessResult, PerfResult, PolicyResult, RecordedResult,
                                            finite)
from pytest_cudaopt.results.tables import TABLE_WIDTH, render_rows  # noqa: F401 - report.render_rows is the API

KIND_ORDER = ("correctness", "perf", "policy")
TOP_KERNELS = 5


def machine_info(info: dict[str, Any]) -> None:
    """Add the GPU and the torch/CUDA versions to pytest-benchmark's machine info."""
    env = environment()
    info.update({"gpu": env["gpu"] or "none", "gpu_capability": env["gpu_capability"],
                 "torch": env["torch"], "cuda": env["cuda"], "cudnn": env["cudnn"]})


def _short_path(path: str) -> str:
    """A workdir as the user named it: relative to the current folder when inside it."""
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


def correctness_row(r: CorrectnessResult) -> dict[str, str]:
    """The correctness table's row of one item."""
    p = r.precision if r.precision is not None and r.precision.tier != "unknown" else None
    return {
        "workdir": _short_path(r.workdir), "case": r.case, "inputs": r.shapes, "max abs err": _sci(r.max_abs),
        "max rel err": _sci(r.max_rel), "rel L2 vs fp64": _sci(p.candidate_error if p else None),
        "fp32 ref vs fp64": _sci(p.reference_error if p else None),
        "precision": (r.precision.tier + (" (atol vacuous)" if r.precision.vacuous else "")) if r.precision else "-",
        "verdict": "pass" if r.passed else f"FAIL ({r.check})" if r.check else "FAIL"}


def policy_row(r: PolicyResult) -> dict[str, str]:
    """The policy table's row of one workdir: how many rules passed, the others by status."""
    passed = sum(1 for status in r.rules.values() if status in ACCEPTED)
    by_status: dict[str, list[str]] = {}
    for rule, status in r.rules.items():
        if status not in ACCEPTED:
            by_status.setdefault(status, []).append(rule)
    others = ", ".join(f"{' '.join(rules)} {status}" if len(rules) <= 3 else f"{len(rules)} {status}"
                       for status, rules in by_status.items())
    return {"workdir": _short_path(r.workdir), "rules": f"{passed} of {len(r.rules)} passed",
            "not passed": others or "-", "violations": str(len(r.violations)),
            "verdict": "pass" if r.passed else "FAIL"}


def perf_title(r: PerfResult) -> str:
    return f"cudaopt perf: {r.workdir} ({r.test})"


def describe_gate(gate: SpeedDecision, labels: Mapping[str, str]) -> str:
    """The gate's rule and arithmetic, as one line of the notes."""
    base = labels.get(gate.baseline, gate.baseline)
    custom = labels.get(CUSTOM, CUSTOM)
    rule = f"median({custom}) <= median({base}) / {gate.min_speedup:g}"
    if gate.custom_median is None or gate.baseline_median is None:
        return f"gate: {rule}: FAIL, {gate.reason}"
    arithmetic = (f"gate: {rule}: {format_seconds(gate.custom_median)} <= {format_seconds(gate.baseline_median)} / "
                  f"{gate.min_speedup:g} = {format_seconds(gate.limit)}")
    speed = f"speedup {gate.speedup:.3f}x, needed {gate.min_speedup:g}x"
    if gate.passed:
        return f"{arithmetic}: PASS ({speed})"
    if gate.reason.startswith("speedup"):
        return f"{arithmetic}: FAIL ({speed})"
    # A failed contender: its median does not count; the reason is in the notes.
    return f"{arithmetic}: FAIL, {gate.reason.split(':')[0]} (see below)"


def perf_rows(r: PerfResult) -> list[dict[str, str]]:
    """One row per contender: medians of device time and latency (the gate's clock marked "(gate)"),
    the kernel sum where traced, the ratios."""
    medians = r.medians()
    failures = r.failures()
    with_tf32 = PRECISION_MATCHED in medians or PRECISION_MATCHED in r.errors
    keys = list(r.measurement.results) if r.measurement is not None else []
    keys += [k for k in r.errors if k not in keys and not k.endswith("*")]
    gated = {clock: f"{name} (gate)" if clock == r.gate_clock else name
             for clock, name in (("device", "device time"), ("latency", "latency"))}
    rows = []
    for key in keys:
        result = r.measurement.results.get(key) if r.measurement is not None else None
        s = result.summary if result is not None and result.samples else None
        mid = s.median if s else None
        timed = result is not None and result.samples
        rows.append({"contender": r.label(key),
                     gated["device"]: format_seconds(result.device_summary.median) if timed else "-",
                     gated["latency"]: format_seconds(result.latency_summary.median) if timed else "-",
                     **({"kernel sum": format_seconds(r.kernel_sum(key))} if r.traces else {}),
                     "IQR": format_seconds(s.iqr) if s else "-", "n": str(s.n) if s else "0",
                     "vs eager": _ratio(medians.get(EAGER), mid), "vs compile": _ratio(medians.get(COMPILE), mid),
                     **({"vs compile+TF32": _ratio(medians.get(PRECISION_MATCHED), mid)} if with_tf32 else {}),
                     "precision": r.tiers.get(key, "-"), "verdict": _perf_verdict(r, key, failures)})
    return rows


def _perf_verdict(r: PerfResult, key: str, failures: Mapping[str, str]) -> str:
    if key == CUSTOM:
        if r.gate.passed and not r.failure:
            return f"PASS (>= {r.gate.min_speedup:g}x)"
        if failures.get(CUSTOM) or r.gate.passed:
            return "FAIL (see below)"
        return f"FAIL (< {r.gate.min_speedup:g}x)" if r.gate.speedup else "FAIL (see below)"
    if failures.get(key):
        return "error (see below)"
    if key == r.gate.baseline:
        return "gate baseline"
    if key.startswith(PEER_PREFIX):
        return "not gated"
    return {EAGER: "reference", TARGET: "regression baseline"}.get(key, "baseline")


def perf_row(r: PerfResult) -> dict[str, str]:
    """The one-line summary of this verdict."""
    medians = r.medians()
    mid = medians.get(CUSTOM)
    return {"workdir": r.workdir, "custom": format_seconds(mid), "compile": format_seconds(medians.get(COMPILE)),
            "vs compile": _ratio(medians.get(COMPILE), mid), "vs eager": _ratio(medians.get(EAGER), mid),
            "precision": r.precision, "verdict": "pass" if r.passed else "FAIL"}


def perf_notes(r: PerfResult) -> list[str]:
    lines = []
    if r.failure:
        lines.append(f"FAIL: {r.failure}")
    lines.append(describe_gate(r.gate, r.labels))
    if r.regression:
        lines.append(r.regression["note"])
    for key, reason in r.failures().items():
        lines.append(reason if key.endswith("*") else f"{r.label(key)}: {reason}")
    lines += _figure_notes(r)
    if r.precision_note:
        lines.append(f"precision of {r.label(CUSTOM)}: {r.precision_note}")
    if r.compile_seconds:
        lines.append("compile time (first call, not in the medians): " + "; ".join(
            f"{r.label(k)} {v:.1f} s" for k, v in r.compile_seconds.items()))
    m = r.measurement
    if m is not None:
        flush = f"L2 flushed with {m.flush_bytes / 2**20:.0f} MiB before each batch" if m.flush_bytes else "no cache flush"
        batch = f"{m.batch} calls of each contender a round back to back" if m.batch > 1 else "one call of each contender a round"
        stop = {"target_rse": f"every median's relative standard error <= {m.config.target_rse:g}",
                "max_time": f"time cap of {m.config.max_time:g} s",
                "max_rounds": "round cap", "all failed": "every contender failed"}.get(m.stop_reason, m.stop_reason)
        lines.append(f"timing: {m.clock}, {m.rounds} interleaved rounds ({batch}) in {m.seconds:.1f} s, stopped by "
                     f"{stop}; {flush}; "
                     f"warm-up {m.config.warmup:g} s per contender; every call on a fresh input set ({m.inputs_drawn} drawn)")
        lines.append(_clocks_note(m) + ("; kernel sum: the kernels, copies and memsets of one profiled call"
                                        if r.traces else ""))
    env = r.environment
    if env:
        gpu = f"{env.get('gpu')} ({env.get('gpu_capability')})" if env.get("gpu") else "no GPU"
        lines.append(f"environment: {gpu}, torch {env.get('torch')}, CUDA {env.get('cuda')}")
    return lines


def _clocks_note(m) -> str:
    """What the two figures measured."""
    gated = f"clocks: the gate compares {'device time' if m.gate_clock == 'device' else 'latency'}. "
    if m.clock == "perf-counter":
        return gated + ("on the CPU both figures are the host's wall time around one call (no GPU to queue "
                        "behind, no cache flush), measured in separate runs")
    ahead = (f"; the host stayed ahead in {m.queued_rounds - m.behind_rounds} of {m.queued_rounds} rounds"
             if m.queued_rounds else "")
    return gated + (f"device time: each contender's batch queued with the host ahead of the GPU after an L2 flush, a "
                    f"call's figure the time between the events before and after it{ahead}; ModelNew in its worker "
                    f"process, its figures checked against this process's clock around its GPU work (the timed window; "
                    f"the round trip where there is none); latency: each call from an idle device, launches included")


def _figure_notes(r: PerfResult) -> list[str]:
    """The kernel trace's notes, and where the candidate's three figures disagree."""
    lines = []
    custom = r.traces.get(CUSTOM)
    if custom is not None and not custom.error:
        top = ", ".join(
            f"{name}{f' x{calls}' if calls > 1 else ''} {format_seconds(total)} ({total / custom.kernel_sum:.0%}"
            + (f", grid {'x'.join(map(str, first.grid))}" if first.grid else "") + ")"
            for name, calls, total, first in custom.top(TOP_KERNELS) if custom.kernel_sum > 0)
        lines.append(f"kernels of {r.label(CUSTOM)} (one call: {custom.summary()}, "
                     f"{format_seconds(custom.kernel_sum)}): {top or 'none'}")
    others = [(k, t) for k, t in r.traces.items() if k != CUSTOM and not t.error]
    if others:
        lines.append("kernels of the others (one call): " + "; ".join(
            f"{r.label(k)} {t.summary()}, {format_seconds(t.kernel_sum)}" for k, t in others))
    failures = r.failures()
    for key, found in r.traces.items():
        if found.error:
            lines.append(f"kernel trace of {r.label(key)}: {found.error}")
            continue
        escaped = found.escape_message()
        if escaped and failures.get(key) != escaped:  # failed by another check first
            lines.append(f"{r.label(key)}: {escaped}")
    result = r.measurement.results.get(CUSTOM) if r.measurement is not None else None
    if result is not None and not result.failure:
        lines += [f"{r.label(CUSTOM)}: {w}" for w in r.figure_warnings]
    return lines


def perf_table(r: PerfResult) -> str:
    """The failure message and the terminal section: title, table, notes."""
    return render_rows(perf_rows(r), title=perf_title(r), notes=perf_notes(r))


def gate_figure_lines(results: Sequence[Any], config: Any = None) -> list[str]:
    """Beside pytest-benchmark's table (where `config` has it on): which figure each perf gate read."""
    if config is not None and (not config.pluginmanager.hasplugin("benchmark")
                               or config.getoption("benchmark_disable", False)):
        return []
    lines = []
    for r in results:
        if getattr(r, "kind", "") != "perf" or getattr(r, "measurement", None) is None:
            continue   # a pytest-xdist worker's record: its table says it
        custom = r.medians().get(CUSTOM)
        if custom is None:
            continue
        clock = "device time" if r.gate_clock == "device" else "latency"
        lines.append(f"cudaopt: the perf gate of {_short_path(r.workdir)} read ModelNew's median {clock}, "
                     f"{format_seconds(custom)} (the perf table's '(gate)' column); pytest-benchmark's table "
                     f"times ModelNew again, alone, from the host with a synchronise per call, for "
                     f"--benchmark-compare: the gate does not read it")
    return lines


def benchmark_extra_info(r: PerfResult) -> dict[str, Any]:
    """pytest-benchmark `extra_info`: medians, speedups, GPU, versions, precision tier."""
    medians = r.medians()
    info: dict[str, Any] = {"workdir": r.workdir}
    for key, value in medians.items():
        info[f"{key.replace('peer:', 'peer_').replace('-', '_')}_median_s"] = value
    custom = medians.get(CUSTOM)
    names = {EAGER: "eager", COMPILE: "compile", PRECISION_MATCHED: "precision_matched"}
    names.update({key: f"peer_{key[5:]}" for key in medians if key.startswith(PEER_PREFIX)})
    info.update({f"speedup_vs_{name}": medians[key] / custom for key, name in names.items()
                 if custom and key in medians})
    result = r.measurement.results.get(CUSTOM) if r.measurement is not None else None
    if result is not None and result.samples:
        info["custom_device_median_s"] = result.device_summary.median
        info["custom_latency_median_s"] = result.latency_summary.median
    if r.kernel_sum(CUSTOM) is not None:
        info["custom_kernel_sum_s"] = r.kernel_sum(CUSTOM)
    info.update({"precision_tier": r.precision, "gate": r.gate.baseline, "gate_clock": r.gate_clock,
                 "min_speedup": r.gate.min_speedup, "gate_passed": r.passed,
                 "compile_seconds": r.compile_seconds.get(COMPILE),
                 "gpu": r.environment.get("gpu"), "gpu_capability": r.environment.get("gpu_capability"),
                 "torch": r.environment.get("torch"), "cuda": r.environment.get("cuda")})
    return info


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator or math.isnan(numerator) or math.isnan(denominator):
        return "-"
    return f"{numerator / denominator:.2f}x"


def record(result: Any) -> dict[str, Any]:
    """A result as plain data (kind, passed, its rows, title and notes): what the JSON report holds."""
    if isinstance(result, RecordedResult):
        return dict(result.record)
    rec: dict[str, Any] = {"kind": getattr(result, "kind", "other"), "passed": bool(result.passed),
                           "data": result.to_json()}
    if isinstance(result, PerfResult):
        rec.update(row=perf_row(result), rows=perf_rows(result), title=perf_title(result), notes=perf_notes(result))
    elif isinstance(result, CorrectnessResult):
        rec["row"] = correctness_row(result)
    elif isinstance(result, PolicyResult):
        rec["row"] = policy_row(result)
    else:
        rec["row"] = {str(k): str(v) for k, v in result.row().items()}
    # Plain types only: records cross from pytest-xdist workers through execnet.
    return json.loads(strict_dumps(rec))


def render_records(records: Sequence[Mapping[str, Any]], fmt: str = "table") -> str:
    """Every record: results with several rows as a table each, the others one table per kind."""
    kinds = [k for k in KIND_ORDER if any(r["kind"] == k for r in records)]
    kinds += sorted({r["kind"] for r in records} - set(kinds))
    sections = []
    for kind in kinds:
        mine = [r for r in records if r["kind"] == kind]
        flat = [r for r in mine if "rows" not in r]
        if flat:
            passed = sum(1 for r in flat if r["passed"])
            sections.append(render_rows([r["row"] for r in flat], fmt=fmt,
                                        title=f"cudaopt {kind}: {passed} of {len(flat)} passed"))
        for r in mine:
            if "rows" in r:
                sections.append(render_rows(r["rows"], title=r.get("title", kind), notes=r.get("notes", ()), fmt=fmt))
    return "\n\n".join(sections)


def account_lines(account: Any, limit: int = 10) -> list[str]:
    """What the JSON report's `passed` and `complete` say (ledger.Account), as the summary's last lines."""
    counts = ", ".join(f"{n} {status}" for status, n in account.counts.items())
    if account.passed:
        return [f"cudaopt: passed: every verdict asked for ran and passed ({counts})"]
    blame = getattr(account, "blame", None)  # the candidate's is the verdict; any other's is no verdict
    lines = [f"cudaopt: NOT PASSED ({counts or 'no verdict items'})"
             + (f"; not the candidate's fault but the {blame}'s" if blame not in (None, "candidate") else "")
             + ("" if account.complete else f"; incomplete: {account.reason}")]
    reasons = [r for r in account.not_passed if not r.startswith("the session did not complete")]
    lines += [f"  {reason}" for reason in reasons[:limit]]
    if len(reasons) > limit:
        lines.append(f"  ... and {len(reasons) - limit} more (all of them in the JSON report's not_passed)")
    return lines


def terminal_summary(terminalreporter: Any, records: Sequence[Mapping[str, Any]], last_lines: Sequence[str]) -> None:
    """The cudaopt section of pytest's terminal summary: the tables, then `last_lines`."""
    if not records and not last_lines:
        return
    terminalreporter.write_sep("=", "cudaopt summary")
    for line in [*(render_records(records, "table").splitlines() if records else []), *last_lines]:
        terminalreporter.write_line(line)


def strict_dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON: a NaN or infinite float becomes null, a Path its text, anything else its repr."""
    return json.dumps(finite(value), allow_nan=False,
                      default=lambda v: str(v) if isinstance(v, Path) else repr(v), **kwargs)
