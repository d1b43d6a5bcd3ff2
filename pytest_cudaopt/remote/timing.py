"""What the judging process believes of the worker's clock: every allowance, its measured basis, and the rule that tells an honest worker's noise from a lie."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

# -- the round trip (client.Worker.handoff_bound) ------------------------------------------------
HANDOFF_FACTOR = 3          # a round trip may exceed the figures by this many pings ...
HANDOFF_SLACK_S = 500e-6    # ... plus this (the worker's GPU lead spin, protocol.LEAD_S, is inside it)
# A CUDA tensor crosses as an IPC handle. Measured on an H200: a round trip less the figures 1.6 ms for one tensor each
# way (~1 ms beyond the pings and the spin), up to ~135 us a further tensor. Allowed: twice that.
CUDA_MESSAGE_S = 2e-3
CUDA_HANDLE_S = 200e-6
PING_CAP_FACTOR = 4         # a ping the worker slows counts at most this many calibrated pings
CALIBRATION_PINGS = 5
# On the CPU a loaded host's late wakeups may add this to a round trip (an honest 70 us call on a
# busy 2-core host waited up to 10.6 ms for its turn; an honest batch, three test processes on 2
# cores, 28.6 ms): twice the worst seen, the wall clock's allowance only (the CPU time's is tight).
CPU_WAKEUP_S = 60e-3
# Serving a call costs the worker's CPU 45-60 us beyond its figure, a batch ~280 us (2 cores; 0.9 ms
# beside 4 spinning processes): the CPU-time bound allows CPU_CALL_S a call and a handoff, at most
# CPU_HANDOFF_S (a loaded host's slow pings widen the wall clock's handoff, not the worker's CPU time).
CPU_HANDOFF_S, CPU_CALL_S = 5e-3, 100e-6

# -- the timed window (window.JudgeWindow) -----------------------------------------------------
# A gated batch's allowance: the calibrated windows' 90th percentile (+ what a longer batch adds,
# JudgeWindow.extra) + MARGIN_S + CALL_MARGIN_S a call. Its honest part: their median (+ extra) +
# HONEST_CALL_S a call (an honest batch's window less its figures grew ~1.1-1.5 us a call from
# batches of 1 to 16 on an H200; the calibration's one-output batches do not hold that).
MARGIN_S = 20e-6
CALL_MARGIN_S = 1.5e-6
HONEST_CALL_S = 1.1e-6

# -- the rule (a lie shows in the pattern of shortfalls; one is noise) -------------------------------
# The fixed part is right per worker only to tens of us (honest H200 medians -17..+56 us, p99 125 us:
# benchmarks/results/2026-12-04-clock-shave.md).
# SHORT_*: short past the allowance (+SHORT_PAST_S behind the gate) on > SHORT_SHARE of calls; honest: 0%.
# SLOPE_*: the shortfall's growth from the fewest to the most calls a batch; honest: <= 58 us (2.2%),
# up to 17% of a 16 us kernel's figures under 31 us; a 50% shave: 102-174 us, 83-150%.
# SHORT_PAST_SHARE: of a long batch, noise grows with it (an honest 200 ms call ran 0.58% past its window on an
# H100 with the host busy: benchmarks/results/2026-12-06-exits.md); a shave under it gains under 1%.
SHORT_SHARE = 0.75
SHORT_PAST_S = 100e-6
SHORT_PAST_SHARE = 0.01
SHORT_MIN = 3
SLOPE_FLOOR_S = 40e-6
SLOPE_SHARE = 0.10
SLOPE_MIN = 4
# A GPU batch outside the gate is checked only to its round trip's allowance: where the median
# allowance a call is more than this share of the median figure, the speed verdict cannot rest on it.
RESOLUTION_SHARE = 0.03


class TimingError(RuntimeError):
    """A timing could not be trusted."""


@dataclass(frozen=True)
class Bound:
    """One of this process's clocks around a batch: its time, honest shortfall, and allowance."""

    outer: float
    honest: float
    allowance: float


@dataclass
class Batch:
    """One timed batch as judged: `short` past its allowance (0: not), `shift` = outer - honest - figures."""

    figures: list[float]
    counted: list[float]
    gated: bool
    short: float
    shift: float
    allowance: float

    @property
    def calls(self) -> int:
        return len(self.figures)


def credit(figures: list[float], bounds: list[Bound], *, gated: bool) -> Batch:
    """One batch's figures as far as `bounds` bear them out: never above the first; raised where short past one."""
    calls, total = len(figures), sum(figures)
    if not calls or not all(x >= 0.0 for x in figures):
        raise TimingError(f"the candidate's process answered {calls} figures, some negative, for a timed batch")
    first = bounds[0]
    if total > first.outer * (1 + 1e-3) + 2e-6:
        raise TimingError(f"the worker's figures for {calls} calls of ModelNew ({total * 1e6:.1f} us) add up to "
                          f"more than the {first.outer * 1e6:.1f} us this process measured around them: the "
                          "candidate's process misreported its time")
    over = [b for b in bounds if b.outer - total > b.allowance]
    short = max((b.outer - total - b.allowance for b in over), default=0.0)
    counted = list(figures)
    if over:
        deficit = max(b.outer - b.allowance for b in over) - total
        if deficit > 0:
            counted = [x + deficit / calls for x in figures]
    return Batch(list(figures), counted, gated, short, first.outer - first.honest - total, first.allowance)


@dataclass
class ClockAudit:
    """Every timed batch of one ModelNew, and what they say of its worker's clock."""

    batches: list[Batch] = field(default_factory=list)

    def add(self, batch: Batch) -> list[float]:
        self.batches.append(batch)
        return batch.counted

    @property
    def timed_calls(self) -> int:
        return sum(b.calls for b in self.batches)

    @property
    def short_batches(self) -> list[Batch]:
        """The batches short past their allowance by more than noise (behind the gate SHORT_PAST_S, or
        SHORT_PAST_SHARE of the batch's figures where that is more)."""
        return [b for b in self.batches
                if b.short > (max(SHORT_PAST_S, SHORT_PAST_SHARE * sum(b.figures)) if b.gated else 0.0)]

    @property
    def gated(self) -> list[Batch]:
        return [b for b in self.batches if b.gated]

    def slope(self) -> tuple[int, float, int, float, float] | None:
        """Behind the gate: (fewest calls, their median shift, most calls, theirs, the median figure a call)."""
        groups: dict[int, list[Batch]] = {}
        for b in self.gated:
            groups.setdefault(b.calls, []).append(b)
        lengths = sorted(n for n, found in groups.items() if len(found) >= SLOPE_MIN)
        if len(lengths) < 2:
            return None
        few, most = lengths[0], lengths[-1]
        return (few, median(b.shift for b in groups[few]), most, median(b.shift for b in groups[most]),
                median(sum(b.figures) / most for b in groups[most]))

    def failure(self) -> str:
        """Why the worker's figures are not believed ("" when they are): the evidence in words."""
        calls, short = self.timed_calls, self.short_batches
        short_calls = sum(b.calls for b in short)
        reasons = []
        if len(short) >= SHORT_MIN and short_calls > SHORT_SHARE * calls:
            own = sum(sum(b.figures) for b in short) / short_calls
            window = sum(b.shift + sum(b.figures) for b in short) / short_calls
            reasons.append(f"on {short_calls} of {calls} timed calls its own timer reported less time than the "
                           f"judging process measured around the calls, past the allowance for timing noise "
                           f"(on those calls {own * 1e6:.2f} us reported against {window * 1e6:.2f} us measured, "
                           f"less the fixed cost of a batch)")
        found = self.slope()
        if found is not None:
            few, at_few, most, at_most, figure = found
            hidden = at_most - at_few
            share = hidden / ((most - few) * figure) if figure > 0 else float("inf")
            if hidden > SLOPE_FLOOR_S and share > SLOPE_SHARE:
                reasons.append(f"each further call of a batch took {share:.0%} longer by the judging process's clock "
                               f"than by its own timer ({figure * 1e6:.2f} us a call reported; batches of {few} "
                               f"call{'s' if few > 1 else ''} {at_few * 1e6:.1f} us short, of {most} calls "
                               f"{at_most * 1e6:.1f} us short; honest timers stay within {SLOPE_SHARE:.0%} or "
                               f"{SLOPE_FLOOR_S * 1e6:.0f} us)")
        if not reasons:
            return ""
        return ("ModelNew's own timer under-reports its time, so none of its figures count: " + "; ".join(reasons)
                + " (a patched torch.cuda.Event.elapsed_time, a detoured cudaEventElapsedTime or clock, "
                  "or work left running past the timed calls)")

    def unresolved(self, device: str) -> str:
        """On a GPU: why the figures cannot be checked to RESOLUTION_SHARE ("" when they can)."""
        if not device.startswith("cuda") or not self.batches:
            return ""
        outside = [b for b in self.batches if not b.gated]
        if len(outside) * 2 <= len(self.batches):
            return ""
        figure = median(x for b in outside for x in b.counted)
        allowance = median(b.allowance / b.calls for b in outside)
        if allowance <= RESOLUTION_SHARE * figure:
            return ""
        return (f"ModelNew's calls could be timed only by the round trip to its process, which this process can "
                f"check to about {allowance * 1e6:.0f} us a call, against a reported {figure * 1e6:.1f} us: the "
                f"figures cannot be checked to {RESOLUTION_SHARE:.0%}, so the speed verdict cannot pass on them")

    def raised(self) -> list[float]:
        """By how much a figure was raised, per call that was."""
        return [c - f for b in self.batches for f, c in zip(b.figures, b.counted) if c > f]

    def to_json(self) -> dict[str, Any]:
        found = self.slope()
        return {"timed_calls": self.timed_calls, "batches": len(self.batches), "gated_batches": len(self.gated),
                "short_calls": sum(b.calls for b in self.short_batches), "short_batches": len(self.short_batches),
                "raised_calls": len(self.raised()),
                "slope": None if found is None else dict(zip(("fewest_calls", "fewest_shift_s", "most_calls",
                                                               "most_shift_s", "figure_s"), found)),
                # per batch: calls, gated, the figures' sum, shift, allowance and shortfall past it (us)
                "per_batch": [[b.calls, int(b.gated), round(sum(b.figures) * 1e6, 2), round(b.shift * 1e6, 1),
                               round(b.allowance * 1e6, 1), round(b.short * 1e6, 1)] for b in self.batches]}
