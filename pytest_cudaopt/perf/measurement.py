"""What a timing run found: each contender's runs (`ContenderResult`) and the run's facts (`Measurement`), as the gate, the report and the JSON read them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pytest_cudaopt.perf.stats import Summary, median


@dataclass
class ContenderResult:
    """One contender's runs: `device` per queued call, `latency`/`walls`/`escapes` per round, `samples` the gate's."""

    key: str
    label: str
    samples: list[float] = field(default_factory=list)
    device: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    escapes: list[float] = field(default_factory=list)
    warmup_runs: int = 0
    warmup_seconds: float = 0.0
    checked: int = 0
    failure: str | None = None
    error: BaseException | None = field(default=None, repr=False)  # what the contender raised
    untimed: bool = False   # failed in its warm-up as far slower than the gate's baseline (engine.Config.far_slower)

    @property
    def summary(self) -> Summary:
        return Summary.of(self.samples)

    @property
    def device_summary(self) -> Summary:
        return Summary.of(self.device)

    @property
    def latency_summary(self) -> Summary:
        return Summary.of(self.latency)

    @property
    def escape_median(self) -> float:
        return median(self.escapes) if self.escapes else math.nan

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason

    def to_json(self) -> dict[str, Any]:
        s = self.summary
        # NaN and infinite figures (no samples) become null in the JSON writer.
        return {"key": self.key, "label": self.label, "n": s.n, "median_s": s.median,
                "q1_s": s.q1, "q3_s": s.q3, "iqr_s": s.iqr, "rse": s.rse, "min_s": s.minimum,
                "device_median_s": self.device_summary.median, "device_iqr_s": self.device_summary.iqr,
                "latency_median_s": self.latency_summary.median, "latency_iqr_s": self.latency_summary.iqr,
                "wall_median_s": median(self.walls) if self.walls else math.nan,
                "escape_median_s": self.escape_median, "warmup_runs": self.warmup_runs,
                "warmup_s": self.warmup_seconds, "outputs_checked": self.checked, "failure": self.failure,
                "untimed": self.untimed}


@dataclass
class Measurement:
    results: dict[str, ContenderResult]
    schedule: list[tuple[int, str, int]]  # (round, contender key, input set) of every timed call, in run order
    rounds: int
    stop_reason: str                      # "target_rse" | "max_time" | "max_rounds" | "all failed"
    seconds: float
    clock: str
    flush_bytes: int
    escape_floor: float
    config: Any                # the engine's Config
    queued_rounds: int = 0     # rounds timed with the host ahead of the GPU (device time) ...
    behind_rounds: int = 0     # ... and among them, rounds where the host needed longer than the lead
    inputs_drawn: int = 0      # input sets drawn (one per call) ...
    draw_seconds: float = 0.0  # ... and the host time they and the expected outputs took
    batch: int = 1             # calls of each contender per queued pass

    @property
    def gate_clock(self) -> str:
        return self.config.clock

    def __getitem__(self, key: str) -> ContenderResult:
        return self.results[key]

    def to_json(self) -> dict[str, Any]:
        return {"clock": self.clock, "gate_clock": self.gate_clock, "queued_rounds": self.queued_rounds,
                "behind_rounds": self.behind_rounds, "rounds": self.rounds, "stop_reason": self.stop_reason,
                "seconds": self.seconds, "flush_bytes": self.flush_bytes,
                "escape_floor_s": self.escape_floor,
                "target_rse": self.config.target_rse, "max_time_s": self.config.max_time,
                "warmup_s": self.config.warmup, "inputs_drawn": self.inputs_drawn,
                "draw_s": self.draw_seconds, "queue_group": self.config.queue_group, "batch": self.batch,
                "contenders": [r.to_json() for r in self.results.values()]}
