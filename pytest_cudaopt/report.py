"""Verdicts as tables: the perf result model and gate, terminal summary, JSON and Markdown for every result kind.

Longer than the others (~600 lines) because the perf result, its gate and the three renderings
(terminal, JSON, Markdown) read the same rows and notes; split apart they would pass the same
data model back and forth. Its parts are marked by the rulers below."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pytest_cudaopt.contenders import COMPILE, CUSTOM, EAGER, PEER_PREFIX, PRECISION_MATCHED, TARGET
from pytest_cudaopt.timing import Measurement, format_seconds

SCHEMA = "cudaopt-report/1"
KIND_ORDER = ("correctness", "perf", "policy")
GATES = {"compile": COMPILE, "precision-matched": PRECISION_MATCHED}
PERF_COLUMNS = ("contender", "device time", "latency", "kernel sum", "IQR", "n", "vs eager", "vs compile",
                "vs compile+TF32", "precision", "verdict")  # the gate's clock is marked "(gate)"
# The three figures of the candidate (device time, latency, summed kernel time) are expected to
# agree within this share; beyond it the notes say so and what it suggests.
FIGURE_MARGIN = 0.15
TOP_KERNELS = 5


# ---------------------------------------------------------------------------------------
# Environment: for the JSON report, pytest-benchmark's machine info and extra_info


def environment() -> dict[str, Any]:
    """torch, CUDA, cuDNN, Python versions and the GPU (name, compute capability)."""
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": str(torch.__version__),
                            "cuda": torch.version.cuda, "cudnn": None, "gpu": None,
                            "gpu_capability": None}
    try:
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_capability"] = f"sm_{major}{minor}"
    return info


def machine_info(info: dict[str, Any]) -> None:
    """Add the GPU and the torch/CUDA versions to pytest-benchmark's machine info, so that
    --benchmark-compare shows when two runs come from different GPUs."""
    env = environment()
    info.update({"gpu": env["gpu"] or "none", "gpu_capability": env["gpu_capability"],
                 "torch": env["torch"], "cuda": env["cuda"], "cudnn": env["cudnn"]})


# ---------------------------------------------------------------------------------------
# The gate


@dataclass(frozen=True)
class GateVerdict:
    """`median(custom) <= median(baseline) / min_speedup`, or why it could not be decided."""

    passed: bool
    baseline: str                    # contender key of the baseline
    custom_median: float | None
    baseline_median: float | None
    min_speedup: float
    reason: str = ""                 # why it failed (empty when passed)

    @property
    def speedup(self) -> float | None:
        if self.custom_median and self.baseline_median:
            return self.baseline_median / self.custom_median
        return None

    @property
    def limit(self) -> float | None:
        """The largest custom median that passes."""
        return None if self.baseline_median is None else self.baseline_median / self.min_speedup

    def describe(self, labels: Mapping[str, str]) -> str:
        base = labels.get(self.baseline, self.baseline)
        custom = labels.get(CUSTOM, CUSTOM)
        rule = f"median({custom}) <= median({base}) / {self.min_speedup:g}"
        if self.custom_median is None or self.baseline_median is None:
            return f"gate: {rule}: FAIL, {self.reason}"
        arithmetic = (f"gate: {rule}: {format_seconds(self.custom_median)} <= "
                      f"{format_seconds(self.baseline_median)} / {self.min_speedup:g} = "
                      f"{format_seconds(self.limit)}")
        speed = f"speedup {self.speedup:.3f}x, needed {self.min_speedup:g}x"
        if self.passed:
            return f"{arithmetic}: PASS ({speed})"
        if self.reason.startswith("speedup"):
            return f"{arithmetic}: FAIL ({speed})"
        # A failed contender: its median does not count; the reason is in the notes.
        return f"{arithmetic}: FAIL, {self.reason.split(':')[0]} (see below)"

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "baseline": self.baseline, "custom_median_s": self.custom_median,
                "baseline_median_s": self.baseline_median, "min_speedup": self.min_speedup,
                "speedup": self.speedup, "limit_s": self.limit, "reason": self.reason}


def gate_verdict(medians: Mapping[str, float], failures: Mapping[str, str], *,
                 gate: str = "compile", min_speedup: float = 1.05) -> GateVerdict:
    """Decide the gate from the contenders' medians (seconds, by key) and their failures.

    Passes iff the custom path and the baseline chosen by `gate` ("compile" or
    "precision-matched") were both timed without failure and
    `medians["custom"] <= medians[baseline] / min_speedup`."""
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; expected one of {', '.join(GATES)}")
    baseline = GATES[gate]
    custom_median = _finite(medians.get(CUSTOM))
    baseline_median = _finite(medians.get(baseline))

    def fail(reason: str) -> GateVerdict:
        return GateVerdict(False, baseline, custom_median, baseline_median, min_speedup, reason)

    if failures.get(CUSTOM):
        return fail(f"the custom path failed: {failures[CUSTOM]}")
    if custom_median is None:
        return fail("the custom path was not timed")
    if failures.get(baseline):
        return fail(f"the gate's baseline failed: {failures[baseline]}")
    if baseline_median is None:
        return fail(f"the gate's baseline {baseline!r} was not timed")
    if custom_median <= baseline_median / min_speedup:
        return GateVerdict(True, baseline, custom_median, baseline_median, min_speedup)
    return fail(f"speedup {baseline_median / custom_median:.3f}x is below the required {min_speedup:g}x")


def regression_verdict(medians: Mapping[str, float], *, margin: float) -> dict[str, Any]:
    """The candidate against the target branch's ModelNew timed in the same run: passes iff
    `median(custom) <= median(target) * (1 + margin)`. {} when either was not timed (a
    missing baseline never fails a run)."""
    custom, target = _finite(medians.get(CUSTOM)), _finite(medians.get(TARGET))
    if custom is None or target is None:
        return {}
    ratio = custom / target
    passed = ratio <= 1 + margin
    note = (f"regression check: median(ModelNew (custom)) / median(ModelNew (target branch)) = "
            f"{format_seconds(custom)} / {format_seconds(target)} = {ratio:.3f} "
            f"{'<=' if passed else '>'} 1 + {margin:g}: {'PASS' if passed else 'FAIL'}")
    return {"passed": passed, "ratio": ratio, "margin": margin, "custom_median_s": custom,
            "target_median_s": target, "note": note}


def _finite(value: float | None) -> float | None:
    if value is None or math.isnan(value) or math.isinf(value) or value <= 0:
        return None
    return float(value)


# ---------------------------------------------------------------------------------------
# The perf result


@dataclass
class PerfResult:
    """One perf item's verdict, appended to `cudaopt_session.results`: the measurement of
    every contender, their precision tiers, the compile times and the gate."""

    workdir: str
    test: str
    gate: GateVerdict
    measurement: Measurement | None = None
    labels: dict[str, str] = field(default_factory=dict)         # key -> table label
    tiers: dict[str, str] = field(default_factory=dict)          # key -> measured precision tier
    precision_note: str = ""                                     # the candidate's measured errors
    compile_seconds: dict[str, float] = field(default_factory=dict)
    peak_bytes: int | None = None                                # torch's max allocated device memory
    errors: dict[str, str] = field(default_factory=dict)         # key -> why it was not timed
    environment: dict[str, Any] = field(default_factory=dict)
    failure: str = ""                                            # a failure outside the gate
    traces: dict[str, Any] = field(default_factory=dict)         # key -> trace.Trace of one call
    regression: dict[str, Any] = field(default_factory=dict)     # the check against the target branch
    kind: str = "perf"

    @property
    def passed(self) -> bool:
        return self.gate.passed and not self.failure

    @property
    def title(self) -> str:
        return f"cudaopt perf: {self.workdir} ({self.test})"

    @property
    def precision(self) -> str:
        return self.tiers.get(CUSTOM, "-")

    def medians(self) -> dict[str, float]:
        if self.measurement is None:
            return {}
        return {k: r.summary.median for k, r in self.measurement.results.items() if r.samples}

    def failures(self) -> dict[str, str]:
        out = dict(self.errors)
        if self.measurement is not None:
            out.update({k: r.failure for k, r in self.measurement.results.items() if r.failure})
        return out

    def label(self, key: str) -> str:
        return self.labels.get(key, key)

    @property
    def gate_clock(self) -> str:
        return self.measurement.gate_clock if self.measurement is not None else "device"

    def kernel_sum(self, key: str) -> float | None:
        found = self.traces.get(key)
        if found is None or getattr(found, "error", None):
            return None
        return found.kernel_sum

    def rows(self) -> list[dict[str, str]]:
        """One row per contender (PERF_COLUMNS): device time and latency (medians; the
        gate's clock marked "(gate)"; IQR and n are its), the summed kernel time of one
        traced call when there is a trace; 'vs compile+TF32' only when it was timed."""
        medians = self.medians()
        failures = self.failures()
        with_tf32 = PRECISION_MATCHED in medians or PRECISION_MATCHED in self.errors
        keys = list(self.measurement.results) if self.measurement is not None else []
        keys += [k for k in self.errors if k not in keys and not k.endswith("*")]
        gated = {clock: f"{name} (gate)" if clock == self.gate_clock else name
                 for clock, name in (("device", "device time"), ("latency", "latency"))}
        rows = []
        for key in keys:
            result = self.measurement.results.get(key) if self.measurement is not None else None
            s = result.summary if result is not None and result.samples else None
            mid = s.median if s else None
            timed = result is not None and result.samples
            row = {
                "contender": self.label(key),
                gated["device"]: format_seconds(result.device_summary.median) if timed else "-",
                gated["latency"]: format_seconds(result.latency_summary.median) if timed else "-",
                "kernel sum": format_seconds(self.kernel_sum(key)),
                "IQR": format_seconds(s.iqr) if s else "-",
                "n": str(s.n) if s else "0",
                "vs eager": _ratio(medians.get(EAGER), mid),
                "vs compile": _ratio(medians.get(COMPILE), mid),
                "vs compile+TF32": _ratio(medians.get(PRECISION_MATCHED), mid),
                "precision": self.tiers.get(key, "-"),
                "verdict": self._verdict(key, failures),
            }
            if not with_tf32:
                del row["vs compile+TF32"]
            if not self.traces:
                del row["kernel sum"]
            rows.append(row)
        return rows

    def _verdict(self, key: str, failures: Mapping[str, str]) -> str:
        if key == CUSTOM:
            if self.gate.passed and not self.failure:
                return f"PASS (>= {self.gate.min_speedup:g}x)"
            if failures.get(CUSTOM) or self.gate.passed:
                return "FAIL (see below)"
            speed = self.gate.speedup
            return f"FAIL (< {self.gate.min_speedup:g}x)" if speed else "FAIL (see below)"
        if failures.get(key):
            return "error (see below)"
        if key == self.gate.baseline:
            return "gate baseline"
        if key == EAGER:
            return "reference"
        if key.startswith(PEER_PREFIX):
            return "not gated"
        if key == TARGET:
            return "regression baseline"
        return "baseline"

    def row(self) -> dict[str, str]:
        """The one-line summary of this verdict."""
        medians = self.medians()
        mid = medians.get(CUSTOM)
        return {"workdir": self.workdir, "custom": format_seconds(mid),
                "compile": format_seconds(medians.get(COMPILE)),
                "vs compile": _ratio(medians.get(COMPILE), mid),
                "vs eager": _ratio(medians.get(EAGER), mid),
                "precision": self.precision,
                "verdict": "pass" if self.passed else "FAIL"}

    def notes(self) -> list[str]:
        lines = []
        if self.failure:
            lines.append(f"FAIL: {self.failure}")
        lines.append(self.gate.describe(self.labels))
        if self.regression:
            lines.append(self.regression["note"])
        failures = self.failures()
        for key, reason in failures.items():
            lines.append(reason if key.endswith("*") else f"{self.label(key)}: {reason}")
        lines += self.figure_notes()
        if self.precision_note:
            lines.append(f"precision of {self.label(CUSTOM)}: {self.precision_note}")
        if self.compile_seconds:
            lines.append("compile time (first call, not in the medians): " + "; ".join(
                f"{self.label(k)} {v:.1f} s" for k, v in self.compile_seconds.items()))
        m = self.measurement
        if m is not None:
            flush = f"L2 flushed with {m.flush_bytes / 2**20:.0f} MiB before each run" if m.flush_bytes else "no cache flush"
            stop = {"target_rse": f"every median's relative standard error <= {m.config.target_rse:g}",
                    "max_time": f"time cap of {m.config.max_time:g} s",
                    "max_rounds": "round cap", "all failed": "every contender failed"}.get(m.stop_reason, m.stop_reason)
            lines.append(f"timing: {m.clock}, {m.rounds} interleaved rounds in {m.seconds:.1f} s, "
                         f"stopped by {stop}; {flush}; warm-up {m.config.warmup:g} s per contender")
            ahead = (f"; the host stayed ahead in {m.queued_rounds - m.behind_rounds} of {m.queued_rounds} rounds"
                     if m.queued_rounds else "")
            lines.append(f"clocks: the gate compares {'device time' if m.gate_clock == 'device' else 'latency'}. "
                         "device time: each call queued behind the previous ones with the host ahead of the "
                         f"GPU, L2 flush kernel before the start event{ahead}; latency: each call from an "
                         "idle device, launches included"
                         + ("; kernel sum: the kernels, copies and memsets of one profiled call"
                            if self.traces else ""))
        env = self.environment
        if env:
            gpu = f"{env.get('gpu')} ({env.get('gpu_capability')})" if env.get("gpu") else "no GPU"
            lines.append(f"environment: {gpu}, torch {env.get('torch')}, CUDA {env.get('cuda')}")
        return lines

    def figure_notes(self) -> list[str]:
        """The kernel trace (the candidate's top kernels, the others' kernel counts, traces
        that could not be taken) and where the candidate's three figures disagree."""
        lines = []
        custom = self.traces.get(CUSTOM)
        if custom is not None and not custom.error:
            top = ", ".join(
                f"{name}{f' x{calls}' if calls > 1 else ''} {format_seconds(total)}"
                f" ({total / custom.kernel_sum:.0%}"
                + (f", grid {'x'.join(map(str, first.grid))}" if first.grid else "") + ")"
                for name, calls, total, first in custom.top(TOP_KERNELS)
                if custom.kernel_sum > 0)
            lines.append(f"kernels of {self.label(CUSTOM)} (one call: {custom.summary()}, "
                         f"{format_seconds(custom.kernel_sum)}): {top or 'none'}")
        others = [(k, t) for k, t in self.traces.items() if k != CUSTOM and not t.error]
        if others:
            lines.append("kernels of the others (one call): " + "; ".join(
                f"{self.label(k)} {t.summary()}, {format_seconds(t.kernel_sum)}" for k, t in others))
        failures = self.failures()
        for key, found in self.traces.items():
            if found.error:
                lines.append(f"kernel trace of {self.label(key)}: {found.error}")
                continue
            escaped = found.escape_message()
            if escaped and failures.get(key) != escaped:  # failed by another check first
                lines.append(f"{self.label(key)}: {escaped}")
        result = self.measurement.results.get(CUSTOM) if self.measurement is not None else None
        if result is not None and not result.failure:
            lines += [f"{self.label(CUSTOM)}: {w}" for w in self._custom_warnings()]
        return lines

    def table(self) -> str:
        """The failure message and the terminal section: title, table, notes."""
        return render_rows(self.rows(), title=self.title, notes=self.notes())

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "workdir": self.workdir, "test": self.test, "passed": self.passed,
                "failure": self.failure, "precision": self.precision, "tiers": self.tiers,
                "precision_note": self.precision_note, "labels": self.labels,
                "gate": self.gate.to_json(), "compile_seconds": self.compile_seconds,
                "errors": self.errors, "environment": self.environment, "gate_clock": self.gate_clock,
                "regression": self.regression, "peak_bytes": self.peak_bytes,
                "timing": self.measurement.to_json() if self.measurement is not None else None,
                "traces": {k: t.to_json() for k, t in self.traces.items()},
                "figure_warnings": self._custom_warnings()}

    def _custom_warnings(self) -> list[str]:
        result = self.measurement.results.get(CUSTOM) if self.measurement is not None else None
        # On the host clock (CPU workdirs) both figures are host time: their difference is noise.
        if result is None or not result.samples or self.measurement.clock == "perf-counter":
            return []
        return figure_warnings(result.device_summary.median, result.latency_summary.median,
                               self.kernel_sum(CUSTOM))

    def extra_info(self) -> dict[str, Any]:
        """pytest-benchmark `extra_info`: medians, speedups, GPU, versions, precision tier."""
        medians = self.medians()
        info: dict[str, Any] = {"workdir": self.workdir}
        for key, value in medians.items():
            info[f"{key.replace('peer:', 'peer_').replace('-', '_')}_median_s"] = value
        custom = medians.get(CUSTOM)
        for key, name in ((EAGER, "eager"), (COMPILE, "compile"), (PRECISION_MATCHED, "precision_matched")):
            if custom and key in medians:
                info[f"speedup_vs_{name}"] = medians[key] / custom
        for key in medians:
            if key.startswith(PEER_PREFIX) and custom:
                info[f"speedup_vs_peer_{key[5:]}"] = medians[key] / custom
        result = self.measurement.results.get(CUSTOM) if self.measurement is not None else None
        if result is not None and result.samples:
            info["custom_device_median_s"] = result.device_summary.median
            info["custom_latency_median_s"] = result.latency_summary.median
        if self.kernel_sum(CUSTOM) is not None:
            info["custom_kernel_sum_s"] = self.kernel_sum(CUSTOM)
        info.update({"precision_tier": self.precision, "gate": self.gate.baseline, "gate_clock": self.gate_clock,
                     "min_speedup": self.gate.min_speedup, "gate_passed": self.passed,
                     "compile_seconds": self.compile_seconds.get(COMPILE),
                     "gpu": self.environment.get("gpu"), "gpu_capability": self.environment.get("gpu_capability"),
                     "torch": self.environment.get("torch"), "cuda": self.environment.get("cuda")})
        return info


def figure_warnings(device: float | None, latency: float | None, kernel_sum: float | None,
                    margin: float = FIGURE_MARGIN) -> list[str]:
    """Where device time, latency and summed kernel time (seconds; None when absent) of one
    contender disagree by more than `margin`, with what it suggests."""
    out = []
    device = _finite(device)
    latency = _finite(latency)
    if device and kernel_sum is not None:
        gap = (device - kernel_sum) / device
        if abs(gap) > margin:
            why = ("idle gaps between its kernels, or device work the trace did not attribute to the call"
                   if gap > 0 else "kernels that overlap (several streams), or kernels slower in the profiled call")
            out.append(f"device time {format_seconds(device)} and kernel sum {format_seconds(kernel_sum)} "
                       f"differ by {abs(gap):.0%} (more than {margin:.0%}): {why}")
    if device and latency:
        ratio = latency / device
        if ratio > 1 + margin:
            out.append(f"latency {format_seconds(latency)} is {ratio:.2f}x the device time "
                       f"{format_seconds(device)}: launch-bound (host work between launches), which device "
                       "time does not count (--cudaopt-clock=latency gates on latency)")
        elif ratio < 1 - margin:
            out.append(f"latency {format_seconds(latency)} is below the device time {format_seconds(device)} "
                       f"by {1 - ratio:.0%}: queued calls ran slower than calls from an idle device")
    return out


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator or math.isnan(numerator) or math.isnan(denominator):
        return "-"
    return f"{numerator / denominator:.2f}x"


# ---------------------------------------------------------------------------------------
# Rendering: any result with `kind`, `passed`, `row()`, `to_json()` (and perhaps `rows()`)


def record(result: Any) -> dict[str, Any]:
    """A result as plain data: kind, passed, its summary row, and for results with several
    rows (perf) the rows, a title and notes. What the JSON report holds and renders from."""
    rec: dict[str, Any] = {"kind": getattr(result, "kind", "other"), "passed": bool(result.passed),
                           "row": {str(k): str(v) for k, v in result.row().items()},
                           "data": result.to_json()}
    rows = getattr(result, "rows", None)
    if callable(rows):
        rec["rows"] = rows()
        rec["title"] = getattr(result, "title", rec["kind"])
        notes = getattr(result, "notes", None)
        rec["notes"] = list(notes()) if callable(notes) else []
    # Plain types only: records cross from pytest-xdist workers through execnet.
    return json.loads(_dumps(rec))


class RecordedResult:
    """A result rebuilt from its record (results sent from pytest-xdist workers)."""

    def __init__(self, rec: Mapping[str, Any]):
        self._rec = dict(rec)
        self.kind = rec["kind"]
        self.passed = rec["passed"]
        if "rows" in rec:
            self.title = rec.get("title", self.kind)
            self.rows = lambda: list(self._rec["rows"])
            self.notes = lambda: list(self._rec.get("notes", []))

    def row(self) -> dict[str, str]:
        return dict(self._rec["row"])

    def to_json(self) -> dict[str, Any]:
        return self._rec["data"]


def render_rows(rows: Sequence[Mapping[str, str]], *, title: str = "", notes: Iterable[str] = (),
                fmt: str = "table") -> str:
    """Rows (dicts with the same keys, in column order) as a fixed-width table or a
    Markdown table, with a title line above and notes below."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    notes = list(notes)
    if fmt == "markdown":
        out = [f"### {title}", ""] if title else []
        if columns:
            out.append("| " + " | ".join(columns) + " |")
            out.append("|" + "|".join("---" if i == 0 else "---:" if _numeric(cells, i) else "---"
                                      for i in range(len(columns))) + "|")
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in cells]
        if notes:
            out += [""] + [f"- {n}" for n in notes]
        return "\n".join(out)
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; expected 'table' or 'markdown'")
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if _numeric(cells, i) else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    out = [title] if title else []
    if columns:
        out += [line(columns), "  ".join("-" * w for w in widths), *[line(c) for c in cells]]
    out += notes
    return "\n".join(out)


def _numeric(cells: Sequence[Sequence[str]], column: int) -> bool:
    """Right-align columns whose cells start with a digit (or are '-')."""
    values = [line[column] for line in cells if line[column] not in ("-", "")]
    return bool(values) and all(v[:1].isdigit() for v in values)


def render_records(records: Sequence[Mapping[str, Any]], fmt: str = "table") -> str:
    """Every record: results with several rows as a table each, the others one table per
    kind (correctness, perf, policy, then any other kind)."""
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
                sections.append(render_rows(r["rows"], title=r.get("title", kind),
                                            notes=r.get("notes", ()), fmt=fmt))
    return "\n\n".join(sections)


def terminal_summary(terminalreporter: Any, session: Any) -> None:
    """The cudaopt section of pytest's terminal summary: one table per kind (perf: one per
    workdir with its notes)."""
    records = [record(r) for r in session.results]
    if not records:
        return
    terminalreporter.write_sep("=", "cudaopt summary")
    for line in render_records(records, "table").splitlines():
        terminalreporter.write_line(line)
    path = getattr(session.settings, "report", None)
    if path:
        terminalreporter.write_line(f"cudaopt: report written to {path}")


def document(results: Sequence[Any], *, seed: int | None = None,
             settings: Mapping[str, Any] | None = None, relaxations: Sequence[str] = (),
             running: str | None = None, failed_items: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """The JSON report: schema, time, environment, seed, settings, the relaxations in force
    and every result's record. `running` names the item that was about to run when the report
    was written before the end of the run (`"complete": false`): what remains if that item
    hangs the process for good. `failed_items`: items pytest reported as failed that left no
    result (a crashed pytest-xdist worker); any of them fails the report."""
    doc = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "environment": environment(), "seed": seed, "settings": dict(settings or {}),
           "relaxations": list(relaxations),
           "passed": all(bool(r.passed) for r in results) and running is None and not failed_items,
           "results": [record(r) for r in results]}
    if failed_items:
        doc["failed_items"] = [dict(item) for item in failed_items]
    if running is not None:
        doc.update(complete=False, running=running)
    return doc


def write_json(path: str | Path, results: Sequence[Any], *, seed: int | None = None,
               settings: Mapping[str, Any] | None = None, relaxations: Sequence[str] = (),
               running: str | None = None, failed_items: Sequence[Mapping[str, str]] = ()) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _dumps(document(results, seed=seed, settings=settings, relaxations=relaxations,
                           running=running, failed_items=failed_items), indent=2)
    # Written aside and renamed: a process killed mid-write leaves the previous report whole.
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(text + "\n")
    os.replace(partial, path)
    return path


def _dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON: a NaN or infinite float (a median of no samples, a ratio of zeros)
    becomes null, a Path its text, anything else not JSON its repr."""
    return json.dumps(_nan_to_none(value), allow_nan=False, default=_json_default, **kwargs)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _nan_to_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(item) for item in value]
    return value


def _json_default(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else repr(value)


def render_file(path: str | Path, fmt: str = "table") -> str:
    """Render a `--cudaopt-report` JSON file as tables (`cudaopt report`) or Markdown."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a cudaopt JSON report ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a cudaopt JSON report (schema {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                         f"expected {SCHEMA!r})")
    env = doc.get("environment") or {}
    gpu = f"{env.get('gpu')} ({env.get('gpu_capability')})" if env.get("gpu") else "no GPU"
    head = (f"cudaopt report {path.name}: {doc.get('created', '?')}, {gpu}, torch {env.get('torch')}, "
            f"CUDA {env.get('cuda')}, seed {doc.get('seed')}")
    body = render_records(doc.get("results", []), fmt)
    if fmt == "markdown":
        head = f"_{head}_"
    return head + ("\n\n" + body if body else "\n\n(no results)")
