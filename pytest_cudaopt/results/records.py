"""The result of each verdict as data: what the correctness, perf and memory-safety items found, and results read back from records."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # types only: this module imports nothing of the package at run time
    from pytest_cudaopt.correctness.precision import Precision
    from pytest_cudaopt.perf.engine import Measurement
    from pytest_cudaopt.perf.decision import SpeedDecision

CUSTOM = "custom"  # the candidate's contender key (perf.lineup.CUSTOM)
# How an item ended, in the JSON report (ledger.py); a disabled rule or a not applicable item
# leaves `passed` true, any other status but passed makes it false.
PASSED, FAILED, SKIPPED, NOT_RUN = "passed", "failed", "skipped", "not run"
DISABLED, NOT_APPLICABLE = "disabled", "not applicable"
STATUSES = (PASSED, FAILED, SKIPPED, NOT_RUN, DISABLED, NOT_APPLICABLE)
ACCEPTED = frozenset({PASSED, DISABLED, NOT_APPLICABLE})
# The `check` of a correctness case that could not get the device memory it needs (the judge retries it alone).
SHORTFALL = "memory"


@dataclass
class CorrectnessResult:
    """One correctness item's verdict, appended to `cudaopt_session.results`."""

    workdir: str
    test: str                  # pytest node id
    case: str                  # "canonical seed0", "drawn shapes (25 cases)"
    passed: bool
    shapes: str = ""           # the inputs: "x: float32[16, 256]"
    seed: int | None = None
    cases: int = 0             # cases run (drawn shapes: examples that ran)
    max_abs: float | None = None
    max_rel: float | None = None
    precision: "Precision | None" = None
    check: str = ""            # the guard or comparison that failed
    message: str = ""
    seconds: float = 0.0
    kind: str = "correctness"
    peak_bytes: int | None = None  # torch's max allocated device memory during the item (the judging process's)
    worker_bytes: int | None = None  # device memory the candidate's worker held at the item's end (NVML)
    state: str = ""            # Model's state: "default" (as initialised) or "moved" (correctness.state)
    harness_seconds: float = 0.0  # of `seconds`, the harness's own steps (state moves, inputs, references)
    values: dict[str, Any] = field(default_factory=dict)  # value family -> cases, tier, skips (correctness.values)
    blame: str | None = None   # whose fault a failure is (blame.py); None when it passed

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "workdir": self.workdir, "test": self.test, "case": self.case, "passed": self.passed,
                "inputs": self.shapes, "seed": self.seed, "cases": self.cases, "max_abs": self.max_abs,
                "max_rel": self.max_rel, "precision": self.precision.to_json() if self.precision else None,
                "check": self.check, "message": self.message, "seconds": self.seconds, "peak_bytes": self.peak_bytes,
                "worker_bytes": self.worker_bytes, "state": self.state,
                "harness_seconds": round(self.harness_seconds, 3), "values": self.values,
                "blame": None if self.passed else (self.blame or "candidate")}


@dataclass
class PerfResult:
    """One perf item's verdict, appended to `cudaopt_session.results`."""

    workdir: str
    test: str
    gate: "SpeedDecision"
    measurement: "Measurement | None" = None
    labels: dict[str, str] = field(default_factory=dict)         # key -> table label
    tiers: dict[str, str] = field(default_factory=dict)          # key -> measured precision tier
    precision_note: str = ""                                     # the candidate's measured errors
    compile_seconds: dict[str, float] = field(default_factory=dict)
    peak_bytes: int | None = None                                # torch's max allocated device memory
    errors: dict[str, str] = field(default_factory=dict)         # key -> why it was not timed
    environment: dict[str, Any] = field(default_factory=dict)
    failure: str = ""                                            # a failure outside the gate
    traces: dict[str, Any] = field(default_factory=dict)         # key -> perf.trace.Trace of one call
    regression: dict[str, Any] = field(default_factory=dict)     # the check against the target branch
    figure_warnings: list[str] = field(default_factory=list)     # where the candidate's figures disagree
    clock: dict[str, Any] = field(default_factory=dict)          # the worker's clock as checked (remote/timing.py)
    timed_precision: dict[str, Any] | None = None                # ModelNew's timed outputs' error and bound
    kind: str = "perf"

    @property
    def passed(self) -> bool:
        return self.gate.passed and not self.failure

    @property
    def reason(self) -> str:
        """Why the item fails, in one line ("" when it passes)."""
        if self.passed:
            return ""
        lines = (self.failure or self.gate.reason or "the gate failed").strip().splitlines()
        return lines[0].removesuffix(":") if lines else "the gate failed"

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

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "workdir": self.workdir, "test": self.test, "passed": self.passed,
                "failure": self.failure, "precision": self.precision, "tiers": self.tiers,
                "precision_note": self.precision_note, "labels": self.labels, "gate": self.gate.to_json(),
                "compile_seconds": self.compile_seconds, "errors": self.errors, "environment": self.environment,
                "gate_clock": self.gate_clock, "regression": self.regression, "peak_bytes": self.peak_bytes,
                "timing": self.measurement.to_json() if self.measurement is not None else None,
                "traces": {k: t.to_json() for k, t in self.traces.items()},
                "figure_warnings": list(self.figure_warnings), "clock": self.clock,
                "timed_precision": self.timed_precision}


@dataclass
class PolicyResult:
    """One workdir's policy verdict: the status of each rule's item and the violations found."""

    workdir: str
    rules: dict[str, str] = field(default_factory=dict)      # rule id -> status
    reasons: dict[str, str] = field(default_factory=dict)    # rule id -> why it did not pass
    violations: list[str] = field(default_factory=list)      # `path:line: RULE: ...` lines
    kind: str = "policy"

    @property
    def passed(self) -> bool:
        return bool(self.rules) and all(status in ACCEPTED for status in self.rules.values())

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "workdir": self.workdir, "passed": self.passed, "rules": dict(self.rules),
                "reasons": dict(self.reasons), "violations": list(self.violations)}


@dataclass
class MemorySafetyResult:
    """The memory-safety item's verdict (`failures`: why nothing could be vouched for)."""

    workdir: str
    test: str
    case: str                                                    # "batch_size=1" or "canonical"
    passed: bool
    tools: dict[str, str] = field(default_factory=dict)          # tool -> "clean", "2 finding(s)", "not run"
    findings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    seconds_by_tool: dict[str, float] = field(default_factory=dict)
    kind: str = "memsafety"

    @property
    def message(self) -> str:
        return "\n".join([*self.failures, *self.findings])

    def row(self) -> dict[str, str]:
        return {"workdir": self.workdir.rstrip("/").rsplit("/", 1)[-1], "case": self.case,
                "tools": ", ".join(f"{t} {s}" for t, s in self.tools.items()) or "-",
                "seconds": f"{self.seconds:.1f}", "verdict": "pass" if self.passed else "FAIL"}

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "workdir": self.workdir, "test": self.test, "case": self.case,
                "passed": self.passed, "tools": self.tools, "findings": self.findings, "failures": self.failures,
                "notes": self.notes, "seconds": self.seconds, "seconds_by_tool": self.seconds_by_tool}


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float, in dicts and lists too, as None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


class RecordedResult:
    """A result rebuilt from its record (`report.record`), as pytest-xdist workers send them."""

    def __init__(self, rec: Mapping[str, Any]):
        self.record = dict(rec)
        self.kind = rec["kind"]
        self.passed = rec["passed"]
        self.test = rec.get("data", {}).get("test")

    def to_json(self) -> dict[str, Any]:
        return self.record["data"]
