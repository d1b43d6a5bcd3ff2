"""remote/timing.py with hand-computed numbers shaped like the H200's: what a batch's figures count, and when a worker's clock is not believed."""

from __future__ import annotations

import re

import pytest

from pytest_cudaopt.remote import timing
from pytest_cudaopt.remote.timing import Bound, ClockAudit, TimingError, credit

US = 1e-6
FIXED, P90 = 330 * US, 340 * US   # a gate's calibrated median fixed part and its 90th percentile


def gated_batch(calls: int, call_s: float, shave: float = 0.0, offset: float = 0.0) -> timing.Batch:
    """A gated batch of `calls` calls of `call_s` each whose worker reports `1 - shave` of them; the
    window holds the fixed part, 1.3 us a call of honest growth and this worker's `offset` (what its
    calibration missed)."""
    window = FIXED + offset + calls * (1.3 * US + call_s)
    allowance = P90 + timing.MARGIN_S + calls * timing.CALL_MARGIN_S
    honest = FIXED + calls * timing.HONEST_CALL_S
    return credit([call_s * (1 - shave)] * calls, [Bound(window, honest, allowance)], gated=True)


def run(call_s: float, shave: float = 0.0, offset: float = 0.0, calls: int = 16, jitter: float = 0.0) -> ClockAudit:
    """What the timing engine makes of a small kernel: 40 latency calls (batches of 1), then 12
    batches of `calls` for the device time, each with up to `jitter` of honest noise."""
    audit = ClockAudit()
    for i in range(40):
        audit.add(gated_batch(1, call_s, shave, offset + jitter * (i % 5) / 4))
    for i in range(12):
        audit.add(gated_batch(calls, call_s, shave, offset + jitter * (i % 3) / 2))
    return audit


def test_figures_within_the_allowance_count_as_reported():
    batch = gated_batch(16, 17 * US)
    assert batch.counted == batch.figures and batch.short == 0
    assert batch.shift == pytest.approx(16 * 0.2 * US)   # 1.3 us a call honest growth, 1.1 us of it expected


def test_a_batch_short_past_its_allowance_counts_the_window_less_the_allowance():
    batch = gated_batch(16, 17 * US, shave=0.95)
    # window 330 + 20.8 + 272 us; figures 13.6 us; allowance 340 + 20 + 24 = 384 us: 225.2 us past it
    assert batch.short == pytest.approx(225.2 * US)
    assert sum(batch.counted) == pytest.approx(622.8 * US - 384 * US)


def test_figures_above_the_window_fail_the_batch():
    with pytest.raises(TimingError, match="add up to more than the 100.0 us this process measured"):
        credit([60 * US, 60 * US], [Bound(100 * US, 10 * US, 20 * US)], gated=True)
    with pytest.raises(TimingError, match="some negative"):
        credit([-1 * US], [Bound(100 * US, 10 * US, 20 * US)], gated=True)


def test_a_looser_bound_counts_work_the_first_missed():
    """Work left past DONE: the collect's round trip, less its allowance, counts."""
    batch = credit([10 * US], [Bound(350 * US, 330 * US, 360 * US), Bound(5e-3, 330 * US, 1e-3)], gated=True)
    assert batch.counted == [pytest.approx(4e-3)]


@pytest.mark.parametrize("offset", [-40 * US, 0.0, 25 * US])
def test_an_honest_worker_is_believed_whatever_its_calibration_missed(offset):
    """Honest workers of the H200 sat up to 40 us under their calibrated fixed part and up to ~25 us
    over it in the median: at +25 us half their batches are short past the allowance, and still
    believed."""
    audit = run(17 * US, offset=offset, jitter=20 * US)
    assert audit.failure() == "" and audit.short_batches == []
    assert bool(audit.raised()) == (offset > 0)   # past the allowance: counted at the window less it


@pytest.mark.parametrize("shave", [0.5, 0.95])
@pytest.mark.parametrize("offset", [-40 * US, 0.0, 80 * US])
def test_a_timer_that_reports_a_share_of_its_time_fails_whatever_the_workers_offset(shave, offset):
    audit = run(17 * US, shave=shave, offset=offset, jitter=20 * US)
    assert "ModelNew's own timer under-reports its time, so none of its figures count" in audit.failure()
    # the hidden share of each further call: shave / (1 - shave) of the reported figure (1x, 19x)
    found = re.search(r"each further call of a batch took (\d+)% longer", audit.failure())
    assert found and int(found[1]) >= 100 * shave / (1 - shave), audit.failure()


def test_a_two_percent_shave_passes_and_counts_within_two_percent():
    audit = run(17 * US, shave=0.02, jitter=20 * US)
    assert audit.failure() == ""
    counted = [c for b in audit.batches if b.calls == 16 for c in b.counted]
    assert min(counted) >= 0.98 * 17 * US


def test_the_slope_is_the_hidden_share_of_each_further_call_and_has_a_floor():
    """A 20% shave of a 17 us kernel: 3.4 us more hidden per further call; against 13.6 us reported a
    call that is 25% (+ the 0.2 us a call of honest growth the expectation does not hold: 26%), 54 us
    over 15 further calls. A 10% shave hides 28.5 us: inside the 40 us floor that honest workers'
    noise needs, and it stands (docs/timing.md gives this bound)."""
    found = run(17 * US, shave=0.20).slope()
    assert found is not None
    few, at_few, most, at_most, figure = found
    assert (few, most) == (1, 16) and figure == pytest.approx(13.6 * US)
    assert (at_most - at_few) / (15 * figure) == pytest.approx((3.4 + 0.2) / 13.6)
    assert "took 26% longer" in run(17 * US, shave=0.20).failure()
    assert run(17 * US, shave=0.10).failure() == ""


def test_a_worker_short_on_most_calls_fails_where_no_slope_can_be_read():
    """Long calls go one to a batch: the share of short calls decides."""
    audit = ClockAudit()
    for _ in range(10):
        audit.add(gated_batch(1, 3e-3, shave=0.05))   # 150 us hidden a call, the allowance's margin is 30 us
    assert audit.slope() is None
    assert "on 10 of 10 timed calls its own timer reported less time" in audit.failure()
    honest = ClockAudit()
    for i in range(10):
        honest.add(gated_batch(1, 3e-3, offset=100 * US if i < 7 else 0.0))   # late on 7 of 10
    assert honest.failure() == ""


def test_too_few_short_batches_are_never_a_pattern():
    audit = ClockAudit()
    for _ in range(timing.SHORT_MIN - 1):
        audit.add(gated_batch(1, 17 * US, 0.95))
    assert audit.failure() == ""


def test_calls_the_gate_could_not_time_cannot_carry_a_small_kernels_verdict():
    """By the round trip the allowance is milliseconds: a 17 us call cannot be checked to 3%; a 200 ms
    one can."""
    small, large = ClockAudit(), ClockAudit()
    for _ in range(10):
        small.add(credit([17 * US], [Bound(2e-3, 0.0, 3e-3)], gated=False))
        large.add(credit([200e-3], [Bound(202e-3, 0.0, 3e-3)], gated=False))
    assert "cannot be checked to 3%" in small.unresolved("cuda")
    assert large.unresolved("cuda") == "" and small.unresolved("cpu") == ""
    mixed = run(17 * US)   # the first batch of each shape goes by the round trip; the rest behind the gate
    mixed.add(credit([17 * US], [Bound(2e-3, 0.0, 3e-3)], gated=False))
    assert mixed.unresolved("cuda") == ""


def test_the_report_holds_the_evidence():
    found = run(17 * US, shave=0.5).to_json()
    assert found["timed_calls"] == 40 + 12 * 16 and found["gated_batches"] == 52
    assert found["slope"]["fewest_calls"] == 1 and found["slope"]["most_calls"] == 16
    assert found["per_batch"][-1][:3] == [16, 1, pytest.approx(16 * 8.5)]


def test_a_long_honest_call_a_little_past_its_window_is_believed_and_a_long_shave_is_not():
    """An honest 200 ms call ran 1.15 ms (0.58%) past the judging side's window on each of its calls (an H100
    with its host busy): past the fixed 100 us, within 1% of the figure. A 3% shave of it is not."""
    def audit(past: float) -> ClockAudit:
        found = ClockAudit()
        for _ in range(4):
            found.add(gated_batch(1, 200e-3, offset=past))
        return found

    honest = audit(1.15e-3)
    assert honest.failure() == "" and honest.short_batches == []
    assert min(c for b in honest.batches for c in b.counted) > 200e-3   # still counted at the window less the allowance
    shaved = ClockAudit()
    for _ in range(4):
        shaved.add(gated_batch(1, 200e-3, shave=0.03))
    assert "on 4 of 4 timed calls its own timer reported less time" in shaved.failure()
