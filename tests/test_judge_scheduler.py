"""The judge's scheduler on a fake device list: no processes, a scripted clock."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_cudaopt.judge.scheduler import OVERHEAD_BYTES, Scheduler, Task

GiB = 1 << 30


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _passed(stage, seconds=0.0):
    """A pool stage that passed, as run_stage returns it (a report and one passed case where the stage has items)."""
    from pytest_cudaopt.judge.stages import StageResult

    kind = {"policy": "policy", "check": "correctness", "perf": "perf"}.get(stage)
    report = {"schema": "cudaopt-report/2", "passed": True, "complete": True, "items": [], "results": []}
    return StageResult(stage, "ok", seconds, report=report if kind else None,
                       cases=[{"kind": kind, "name": "t", "outcome": "passed", "seconds": 0.0}] if kind else [])


def _workdirs(root, count):
    """`count` workdirs w0, w1, ... under `root`: one model.py, a model_new.py each."""
    made = []
    for i in range(count):
        made.append(root / f"w{i}")
        made[-1].mkdir()
        (made[-1] / "model.py").write_text("X = 1\n")
        (made[-1] / "model_new.py").write_text(f"Y = {i}\n")
    return made


def _ready_by_stage(tasks):
    return {(t.job, t.stage): t.device for t in tasks}


def test_builds_run_on_cpu_slots_up_to_jobs_and_need_no_device():
    s = Scheduler(["0"], jobs=2)
    for job in range(4):
        s.add(job)
    started = s.ready()
    assert [(t.job, t.stage, t.device) for t in started] == [(0, "build", None), (1, "build", None)]
    assert s.ready() == []  # both slots taken


def test_checks_of_several_workdirs_share_a_gpu_up_to_share():
    s = Scheduler(["0"], jobs=4, share=2)
    for job in range(3):
        s.add(job, stages=["check", "perf"])
    started = s.ready()
    assert _ready_by_stage(started) == {(0, "check"): "0", (1, "check"): "0"}


def test_a_perf_stage_prepares_beside_checks_and_has_its_gpu_to_itself_once_granted():
    s = Scheduler(["0"], jobs=4, share=3, turns=True)
    for job in range(3):
        s.add(job, stages=["check", "perf"])
    first = {t.job: t for t in s.ready()}
    s.finish(first[0])
    perf = s.ready()
    assert perf == [Task(0, "perf", "0")]   # beside the two checks: it starts, imports, compiles
    s.want(perf[0])
    assert s.ready() == [] and s.grants() == [] and s.devices[0].draining   # it asks: nothing joins, the checks end
    s.finish(first[1])
    assert s.ready() == [] and s.grants() == []   # job 1's perf may not start on a draining GPU
    s.finish(first[2])
    assert s.ready() == [] and s.grants() == [0]   # nothing else on the GPU: its turn
    assert s.ready() == []   # nothing joins a perf stage in its turn
    s.finish(perf[0])
    assert {(t.job, t.stage) for t in s.ready()} == {(1, "perf"), (2, "perf")}
    assert not s.devices[0].draining


def test_with_ahead_device_stages_start_up_without_a_place_and_get_one_in_the_order_they_ask():
    s = Scheduler(["0"], jobs=4, share=2, ahead=2, turns=True)
    for job in range(5):
        s.add(job, stages=["check"])
    tasks = {t.job: t for t in s.ready()}
    assert set(tasks) == {0, 1, 2, 3} and s.devices[0].checks == {}   # share + ahead start; none holds a place
    assert s.busy_fraction() == {"0": 0.0}   # starting up is the CPU's work, not the device's
    for job in (3, 1, 0):
        s.enter(tasks[job])
    assert s.admits() == [3, 1] and s.admits() == []   # two places
    assert s.shared(tasks[3]) and s.shared(tasks[1])
    s.finish(tasks[3])
    assert s.admits() == [0]
    assert [t.job for t in s.ready()] == [4]   # room ahead again
    s.finish(tasks[2])   # it ended before it asked (a collection error): it never held a place
    assert s.admits() == [] and set(s.devices[0].checks) == {0, 1}


def test_a_turn_waits_for_the_placed_stages_only_and_none_is_placed_while_the_device_drains():
    s = Scheduler(["0"], jobs=4, share=2, ahead=2, turns=True)
    s.add(0, stages=["perf"])
    for job in (1, 2):
        s.add(job, stages=["check"])
    tasks = {t.job: t for t in s.ready()}
    s.enter(tasks[0])
    s.enter(tasks[1])
    assert s.admits() == [0, 1]
    s.want(tasks[0])
    assert s.grants() == []   # job 1's check holds its place
    s.enter(tasks[2])
    assert s.admits() == []   # the device drains
    s.finish(tasks[1])
    assert s.grants() == [0]   # job 2 only starts up beside the turn
    assert s.admits() == []    # and gets no place in it
    s.finish(tasks[0])
    assert s.admits() == [2] and not s.devices[0].draining


def test_with_ahead_a_place_is_given_while_the_memory_fits_and_a_stage_alone_keeps_its_device():
    s = Scheduler(["0"], jobs=4, share=3, ahead=1, memory={"0": 10 * GiB})
    for job in range(3):
        s.add(job, problem="big", stages=["check"])
    s.expect("big", 6 * GiB)
    tasks = {t.job: t for t in s.ready()}
    for job in range(3):
        s.enter(tasks[job])
    assert s.admits() == [0]   # a second 6 GiB check does not fit beside the first
    s.finish(tasks[0], retry_alone=True)   # to be judged again alone (as the pool does a shortfall beside others)
    assert s.admits() == [1]
    s.finish(tasks[1])
    again = s.ready()
    assert again == [Task(0, "check", "0")] and s.devices[0].alone == 0
    assert s.admits() == []   # nothing placed beside a stage alone
    s.enter(again[0])
    assert s.admits() == [0]   # its own ask is answered at once
    s.finish(again[0])
    assert s.admits() == [2]


def test_without_ahead_a_stage_holds_its_place_from_its_start_and_its_ask_is_answered_at_once():
    s = Scheduler(["0"], jobs=4, share=1)
    s.add(0, stages=["check"])
    s.add(1, stages=["check"])
    (task,) = s.ready()
    assert set(s.devices[0].checks) == {0}
    s.enter(task)
    assert s.admits() == [0] and s.ready() == []


def test_without_turns_a_perf_stage_has_its_gpu_to_itself_from_its_start():
    s = Scheduler(["0"], jobs=4, share=2)
    for job in range(3):
        s.add(job, stages=["check", "perf"])
    first = {t.job: t for t in s.ready()}
    s.finish(first[0])
    # job 0 waits for perf: the GPU drains (job 2's check may not start), job 1 still checks
    assert s.ready() == []
    assert s.devices[0].draining
    s.finish(first[1])
    started = s.ready()
    assert [(t.job, t.stage) for t in started] == [(0, "perf")]
    assert s.ready() == []  # nothing beside a perf stage, not even job 1's perf
    s.finish(started[0])
    assert [(t.job, t.stage) for t in s.ready()] == [(1, "perf")]


def test_perf_stages_that_asked_take_their_turns_one_at_a_time_before_any_check_joins():
    s = Scheduler(["0"], jobs=4, share=3, turns=True)
    for job in range(2):
        s.add(job, stages=["perf"])
    s.add(2, stages=["check"])
    tasks = {t.job: t for t in s.ready()}
    assert set(tasks) == {0, 1, 2}
    s.want(tasks[1])
    s.want(tasks[0])
    assert s.grants() == []   # the check still runs
    s.finish(tasks[2])
    assert s.grants() == [1]   # in the order asked
    assert s.grants() == []    # one turn at a time
    s.finish(tasks[1])
    assert s.grants() == [0]
    s.finish(tasks[0])
    assert s.grants() == [] and s.done


def test_a_perf_stage_that_ends_before_its_turn_leaves_no_drain_behind():
    s = Scheduler(["0"], jobs=4, share=2, turns=True)
    s.add(0, stages=["perf"])
    s.add(1, stages=["check"])
    s.add(2, stages=["check"])
    tasks = {t.job: t for t in s.ready()}
    s.want(tasks[0])
    s.finish(tasks[0], proceed=False)   # it crashed while it waited
    assert [(t.job, t.stage) for t in s.ready()] == [(2, "check")] and s.grants() == []


def test_a_perf_stage_retried_alone_is_granted_its_turn_as_soon_as_it_asks():
    s = Scheduler(["0"], jobs=4, share=2, memory={"0": 80 * GiB}, turns=True)
    s.add(0, stages=["perf"])
    s.add(1, stages=["check"])
    tasks = {t.job: t for t in s.ready()}
    assert s.shared(tasks[0])
    s.finish(tasks[0], retry_alone=True)   # short of memory beside the check
    s.finish(tasks[1])
    again = s.ready()
    assert again == [Task(0, "perf", "0")] and s.devices[0].alone == 0
    s.want(again[0])
    assert s.grants() == [0]


def test_perf_goes_to_an_idle_gpu_while_checks_keep_another_busy():
    s = Scheduler(["0", "1"], jobs=4, share=2)
    for job in range(3):
        s.add(job, stages=["check", "perf"])
    started = s.ready()
    assert sorted(t.device for t in started) == ["0", "0", "1"]   # the GPU with the fewest checks first
    lone = next(t for t in started if t.device == "1")
    s.finish(lone)
    perf = s.ready()
    assert perf == [Task(lone.job, "perf", lone.device)]


def test_memory_learned_from_a_problems_first_check_limits_sharing():
    s = Scheduler(["0"], jobs=4, share=4, memory={"0": 80 * GiB})
    s.add(0, problem="big", stages=["check"])
    s.add(1, problem="big", stages=["check"])
    s.add(2, problem="big", stages=["check"])
    started = s.ready()
    assert len(started) == 3   # unknown need: memory / share each, 3 x 20 GiB fit
    for task in started:
        s.finish(task, peak_bytes=50 * GiB)
    assert s.need["big"] == 50 * GiB + OVERHEAD_BYTES
    for job in (3, 4):
        s.add(job, problem="big", stages=["check"])
    assert len(s.ready()) == 1   # 52 GiB each: a second would not fit in 80


def test_a_dropped_job_runs_no_further_stage():
    s = Scheduler(["0"], jobs=1)
    s.add(0)
    (build,) = s.ready()
    assert s.finish(build, proceed=False) is None
    assert s.done and s.ready() == []


def test_each_gpus_busy_fraction_counts_time_with_anything_on_it():
    clock = Clock()
    s = Scheduler(["0", "1"], jobs=1, share=1, clock=clock)
    s.add(0, stages=["check"])
    (task,) = s.ready()
    clock.now = 30.0
    s.finish(task)
    clock.now = 100.0
    busy = s.busy_fraction()
    assert busy[task.device] == pytest.approx(0.30)
    assert busy["1" if task.device == "0" else "0"] == 0.0


def test_cpu_slots_are_devices_too():
    s = Scheduler(["cpu0", "cpu1"], jobs=2, share=1)
    for job in range(2):
        s.add(job)
    for task in s.ready():   # build
        s.finish(task)
    for task in s.ready():   # policy
        s.finish(task)
    checks = s.ready()
    assert sorted(t.device for t in checks) == ["cpu0", "cpu1"]


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="at least one device"):
        Scheduler([])
    s = Scheduler(["0"])
    s.add(0)
    with pytest.raises(ValueError, match="twice"):
        s.add(0)
    with pytest.raises(ValueError, match="unknown stages"):
        s.add(1, stages=["lint"])


def test_a_problems_estimated_memory_limits_sharing_before_its_first_check():
    """A big problem (the build's estimate: 60 of 100 bytes) checks alone from its first check on."""
    s = Scheduler(["0"], jobs=4, share=4, memory={"0": 100})
    for job in range(3):
        s.add(job, problem="big", stages=["check"])
    s.expect("big", 60)
    assert _ready_by_stage(s.ready()) == {(0, "check"): "0"}   # 60 + 60 > 100
    s.expect("big", 10)   # an estimate never replaces what is known
    assert s.need["big"] == 60


# ------------------------------------------------------------------ memory a check may take

SOFTMAX = '''"""KernelBench L1-23's shape: a softmax over 393216 features of 4096 rows."""

import torch
import torch.nn as nn

batch_size = 4096
dim = 393216


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


def test_a_big_problems_estimate_bounds_its_largest_drawn_case_so_two_checks_never_share_an_h200(tmp_path):
    """Drawn shapes may hold twice the canonical inputs (cudaopt_max_elements' default): the
    estimate is that case's budget, not the canonical one's, and one H200 holds one such check."""
    from pytest_cudaopt.judge.child_build import check_need
    from pytest_cudaopt.primitives.memory import case_budget

    (tmp_path / "model.py").write_text(SOFTMAX)
    canonical = 4096 * 393216 * 4   # bytes of the input; the output is as large
    need = check_need(tmp_path)
    assert need == case_budget(2 * canonical, 2 * canonical)   # the drawn case of twice the elements
    assert check_need(tmp_path, max_elements=1000) == case_budget(canonical, canonical)   # canonical still runs
    h200 = int(139.8 * GiB)
    assert 2 * case_budget(canonical, canonical) < h200 < 2 * need   # the canonical budget would let two in
    s = Scheduler(["0"], jobs=4, share=4, memory={"0": h200})
    for job in range(2):
        s.add(job, problem="softmax", stages=["check"])
    s.expect("softmax", need)
    assert _ready_by_stage(s.ready()) == {(0, "check"): "0"}


def test_the_first_complete_checks_peak_refines_the_estimate_and_no_peak_is_ever_exceeded():
    s = Scheduler(["0"], jobs=4, share=4, memory={"0": 100 * GiB})
    for job in range(4):
        s.add(job, problem="p", stages=["check"])
    s.expect("p", 60 * GiB)
    (first,) = s.ready()
    s.finish(first, peak_bytes=10 * GiB)           # failed early: a lower bound only
    assert s.need["p"] == 60 * GiB
    (second,) = s.ready()
    s.finish(second, peak_bytes=20 * GiB, complete=True)   # every case judged: the measured figure
    assert s.need["p"] == 20 * GiB + OVERHEAD_BYTES
    started = s.ready()
    assert len(started) == 2                         # 22 + 22 GiB fit where 60 + 60 did not
    s.finish(started[0], peak_bytes=30 * GiB, complete=True)
    assert s.need["p"] == 30 * GiB + OVERHEAD_BYTES  # a larger peak always counts


def test_a_check_short_of_memory_beside_another_runs_again_alone_and_nothing_joins_it():
    s = Scheduler(["0"], jobs=4, share=2)
    for job in range(3):
        s.add(job, stages=["check", "perf"])
    first = {t.job: t for t in s.ready()}
    assert sorted(first) == [0, 1] and s.shared(first[0]) and s.shared(first[1])
    assert s.finish(first[0], retry_alone=True) == "check"
    assert s.ready() == []                  # the GPU drains for it: job 2's check waits
    assert s.devices[0].draining
    s.finish(first[1])
    (alone,) = s.ready()
    assert alone == Task(0, "check", "0") and s.devices[0].alone == 0 and not s.shared(alone)
    assert s.ready() == []                  # nothing beside it, not job 1's perf nor job 2's check
    assert s.finish(alone, retry_alone=True) == "perf"   # alone already: no second retry
    assert {(t.job, t.stage) for t in s.ready()} == {(0, "perf")}


def test_a_check_retried_in_place_waits_as_any_check_and_joins_the_others_without_draining():
    s = Scheduler(["0"], jobs=4, share=2)
    for job in range(3):
        s.add(job, stages=["check", "perf"])
    first = {t.job: t for t in s.ready()}
    assert s.finish(first[0], retry=True) == "check"
    again = s.ready()
    assert again == [Task(0, "check", "0")] and not s.devices[0].draining   # beside job 1, ahead of job 2
    assert s.devices[0].alone is None and s.shared(again[0])
    assert s.finish(again[0]) == "perf"


def test_a_check_that_ran_alone_throughout_was_not_shared():
    s = Scheduler(["0", "1"], jobs=4, share=2)
    s.add(0, stages=["check"])
    (task,) = s.ready()
    assert not s.shared(task)


# ------------------------------------------------------------------ a pool fed while it runs

def test_a_fed_pool_judges_workdirs_added_while_it_runs_and_ends_only_when_closed(tmp_path):
    """What a Ray node's judge does: workdirs come one by one; the lines end after close()."""
    import queue
    import threading

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool

    def passes(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        return _passed(stage)

    options = Options(jobs=2, share=2, cache_dir=None, fork=False, scratch=tmp_path / "scratch")
    pool = LocalPool([], options, DeviceSet(["0"]), fed=True, run_stage=passes)
    found: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [found.put(line) for line in pool.lines()] and None, daemon=True)
    reader.start()
    for i, workdir in enumerate(_workdirs(tmp_path, 2)):
        pool.add(workdir, f"named-{i}", key=f"key-{i}")
        line = found.get(timeout=20)
        assert (line["workdir"], line["key"], line["passed"]) == (f"named-{i}", f"key-{i}", True)
    reader.join(timeout=0.5)
    assert reader.is_alive()        # every workdir judged, but more may come
    pool.close()
    reader.join(timeout=20)
    assert not reader.is_alive() and found.empty()
    with pytest.raises(ValueError, match="fed=True"):
        LocalPool([], options, DeviceSet(["0"])).add(tmp_path / "w0")


def test_builds_and_policy_checks_at_once_default_to_half_the_cores_of_the_host_that_judges(monkeypatch):
    from pytest_cudaopt.judge import options as judge_options

    monkeypatch.setattr(judge_options.os, "cpu_count", lambda: 16)
    assert judge_options.Options().cpu_jobs == 8       # resolved where it runs: each Ray node its own
    assert judge_options.Options(jobs=3).cpu_jobs == 3
    assert judge_options.Options.from_json(judge_options.Options().to_json()).jobs is None


def test_stages_start_ahead_of_their_places_on_gpus_by_default_and_not_on_cpu_slots():
    from pytest_cudaopt.judge.options import Options

    assert Options(share=3).stages_ahead == 3
    assert Options(share=3, pytest_args=["--cudaopt-device=cpu"]).stages_ahead == 0   # its slots are the CPUs
    assert Options(share=3, ahead=1, pytest_args=["--cudaopt-device=cpu"]).stages_ahead == 1


def _timed_turn(turn, name: str) -> tuple[str, str, float, float]:
    """As a perf child does once it has prepared: asks for its turn, waits, times for 0.1 s; the turn's span."""
    import time

    from pytest_cudaopt.run import turn as turns

    turns.wait(turn.folder)
    granted = time.monotonic()
    time.sleep(0.1)
    return "turn", name, granted, time.monotonic()


def _paused_steps(what: str, name: str, count: int, pause, spans: list) -> None:
    """As a child's paused work does: `count` steps of 0.05 s, a pause point before each; each step's span."""
    import time

    from pytest_cudaopt.run import turn as turns

    for _ in range(count):
        turns.pause_point(folder=pause.folder)
        start = time.monotonic()
        time.sleep(0.05)
        spans.append((what, name, start, time.monotonic()))


def _turns_alone(spans: list, kinds: tuple[str, ...]) -> list:
    """The turn spans, after checking none overlaps another workdir's span of `kinds` (all kinds when empty)."""
    turn_spans = [s for s in spans if s[0] == "turn"]
    for what, name, start, end in turn_spans:
        beside = [s for s in spans if (not kinds or s[0] in kinds) and s[1] != name and s[2] < end and s[3] > start]
        assert beside == [], f"{name}'s turn overlapped {beside}"
    return turn_spans


def test_in_a_pool_a_perf_turn_overlaps_no_other_stage_on_its_gpu_and_its_wait_is_in_the_line(tmp_path):
    import time

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool
    from pytest_cudaopt.run import turn as turns

    spans: list[tuple[str, str, float, float]] = []   # (what, workdir, start, end)

    def stage(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        if place is not None:
            time.sleep(0.05)   # starting up, without its place
            turns.wait(place.folder)
        began = time.monotonic()
        if stage == "check":
            time.sleep(0.3)
            spans.append(("check", copy.name, began, time.monotonic()))
        if stage == "perf":   # as a perf child does: prepares, asks, waits, times
            time.sleep(0.1)
            spans.append(("prepare", copy.name, began, time.monotonic()))
            spans.append(_timed_turn(turn, copy.name))
        return _passed(stage, time.monotonic() - began)

    workdirs = _workdirs(tmp_path, 6)
    options = Options(jobs=6, share=3, cache_dir=None, fork=False, scratch=tmp_path / "scratch", turns=True)
    found = list(LocalPool(workdirs, options, DeviceSet(["0"]), run_stage=stage).lines())
    assert len(found) == 6 and all(line["passed"] for line in found)
    turn_spans = _turns_alone(spans, ())
    assert len(turn_spans) == 6
    # (that a preparing perf stage runs beside checks: the scheduler's tests above, without timing)
    assert all("perf_wait" in line["seconds"] and line["seconds"]["perf_turn"] >= 0.1 for line in found)
    for line in found:   # each device stage started up (0.05 s) before it asked for its place
        assert {"check_before_place", "check_place_wait", "perf_before_place"} <= set(line["seconds"])
        assert line["seconds"]["check_before_place"] >= 0.05


def test_in_a_pool_a_turn_pauses_the_checks_beside_it_between_their_items_instead_of_waiting_for_their_end(
        tmp_path):
    import time

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool
    from pytest_cudaopt.run import turn as turns

    spans: list[tuple[str, str, float, float]] = []   # (what, workdir, start, end)

    def stage(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        if place is not None:
            turns.wait(place.folder)
        began = time.monotonic()
        if stage == "check":   # as a check child does: a pause point before each item (w0's check is short)
            _paused_steps("item", copy.name, 2 if copy.name == "w0" else 10, pause, spans)
            spans.append(("check", copy.name, began, time.monotonic()))
        if stage == "perf":
            spans.append(_timed_turn(turn, copy.name))
        return _passed(stage, time.monotonic() - began)

    workdirs = _workdirs(tmp_path, 4)
    options = Options(jobs=4, share=4, ahead=0, cache_dir=None, fork=False, scratch=tmp_path / "scratch", turns=True)
    found = list(LocalPool(workdirs, options, DeviceSet(["0"]), run_stage=stage).lines())
    assert len(found) == 4 and all(line["passed"] for line in found)
    turn_spans = _turns_alone(spans, ("item", "turn"))
    within = [t for t in turn_spans if any(c[0] == "check" and c[2] < t[2] and c[3] > t[3] for c in spans)]
    assert within, "a turn began and ended while a check stage was under way (paused), not after it"
    assert any(line["seconds"].get("check_paused", 0) > 0.05 for line in found)


@pytest.mark.parametrize("ahead", [0, 2])
def test_in_a_pool_a_turn_pauses_a_perf_stage_preparing_beside_it_between_its_steps(tmp_path, ahead):
    """w0's perf stage prepares quickly, w1's slowly: w0's turn comes while w1 prepares, paused between its steps
    (its channel exists from its start, placed then or later), not once w1 has prepared."""
    import time

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool
    from pytest_cudaopt.run import turn as turns

    spans: list[tuple[str, str, float, float]] = []   # (what, workdir, start, end)

    def stage(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        if place is not None:
            turns.wait(place.folder)
        began = time.monotonic()
        if stage == "perf":   # as a perf child prepares: steps, a pause point before each
            _paused_steps("step", copy.name, 1 if copy.name == "w0" else 12, pause, spans)
            spans.append(("prepare", copy.name, began, time.monotonic()))
            spans.append(_timed_turn(turn, copy.name))
        return _passed(stage, time.monotonic() - began)

    workdirs = _workdirs(tmp_path, 2)
    options = Options(jobs=2, share=4, ahead=ahead, cache_dir=None, fork=False, scratch=tmp_path / "scratch",
                      turns=True)
    found = list(LocalPool(workdirs, options, DeviceSet(["0"]), run_stage=stage).lines())
    assert len(found) == 2 and all(line["passed"] for line in found)
    turn_spans = _turns_alone(spans, ("step", "turn"))
    w0_turn = next(s for s in turn_spans if s[1] == "w0")
    w1_prepare = next(s for s in spans if s[0] == "prepare" and s[1] == "w1")
    assert w1_prepare[2] < w0_turn[2] and w0_turn[3] < w1_prepare[3], "w0's turn waited for w1's preparation"
    assert {line["workdir"].rsplit("/", 1)[-1]: line["seconds"].get("perf_paused", 0) > 0 for line in found} == {
        "w0": False, "w1": True}


def test_without_pause_a_turn_waits_for_the_checks_beside_it_to_end():
    s = Scheduler(["0"], jobs=4, share=3, turns=True, pause=False)
    for job in range(2):
        s.add(job, stages=["check", "perf"] if job == 0 else ["check"])
    first = {t.job: t for t in s.ready()}
    s.finish(first[0])
    perf = s.ready()[0]
    s.want(perf)
    assert s.pauses() == [] and s.grants() == []
    s.finish(first[1])
    assert s.grants() == [0]


def test_with_pause_a_turn_begins_once_the_checks_beside_it_pause_and_they_resume_after_the_last_turn():
    s = Scheduler(["0"], jobs=4, share=4, turns=True, pause=True)
    for job in range(4):
        s.add(job, stages=["check", "perf"] if job < 2 else ["check"])
    first = {t.job: t for t in s.ready()}
    assert s.pauses() == []   # no turn asked for: nothing pauses
    s.finish(first[0])
    s.finish(first[1])
    perf = {t.job: t for t in s.ready()}
    assert set(perf) == {0, 1}
    s.want(perf[0])
    assert sorted(s.pauses()) == [1, 2, 3] and s.pauses() == []   # each asked once: the checks, job 1's perf stage
    s.paused(first[2])
    assert s.grants() == []   # job 3's check has not paused yet, and job 1's perf stage is still preparing
    s.paused(first[3])
    s.want(perf[1])   # it asks for its turn before it meets its pause point: a turn waits for it no longer
    assert s.grants() == [0] and s.resumes() == []
    s.finish(perf[0])
    assert s.resumes() == [] and s.grants() == [1]   # turns back to back; the checks stay paused
    s.finish(perf[1])
    assert s.resumes() == [2, 3] and s.resumes() == []
    assert not s.devices[0].draining and s.grants() == []


def test_with_pause_a_turn_begins_once_a_perf_stage_preparing_beside_it_pauses_not_once_it_is_prepared():
    s = Scheduler(["0"], jobs=4, share=4, turns=True, pause=True)
    for job in range(2):
        s.add(job, stages=["perf"])
    perf = {t.job: t for t in s.ready()}
    s.want(perf[0])
    assert s.pauses() == [1] and s.grants() == []   # job 1 prepares: asked to pause, the turn waits for that
    s.paused(perf[1])
    assert s.grants() == [0]
    s.finish(perf[0])
    assert s.resumes() == [1] and s.grants() == []   # it prepares on, then asks for its own turn
    s.want(perf[1])
    assert s.pauses() == [] and s.grants() == [1]    # nothing else there to pause; a stage never pauses for its own


def test_a_check_asked_to_pause_that_ends_instead_holds_up_no_turn():
    s = Scheduler(["0"], jobs=4, share=2, turns=True, pause=True)
    s.add(0, stages=["perf"])
    s.add(1, stages=["check"])
    tasks = {t.job: t for t in s.ready()}
    s.want(tasks[0])
    assert s.pauses() == [1]
    s.finish(tasks[1])   # its last item ended: it never pauses
    assert s.grants() == [0] and s.resumes() == []


def test_a_stage_that_leaves_its_device_frees_its_place_and_its_turn_before_it_ends():
    s = Scheduler(["0"], jobs=4, share=1, turns=True, pause=True)
    s.add(0, stages=["perf"])
    s.add(1, stages=["perf"])
    s.add(2, stages=["check"])
    first = {t.job: t for t in s.ready()}
    assert set(first) == {0}   # one place
    s.want(first[0])
    assert s.grants() == [0]
    assert s.ready() == []     # its turn: nothing joins
    s.leave(first[0])          # its timing done, its workers stopped: its process still exits
    second = {t.job: t for t in s.ready()}
    assert set(second) == {1}  # the place it left, while it runs
    s.want(second[1])
    assert s.grants() == [1]   # and the next turn
    s.finish(first[0])         # the first ends after: nothing of the second's changes
    assert s.devices[0].alone == 1 and s.ready() == []
    s.leave(second[1])
    s.leave(second[1])         # said twice: once is enough
    assert [t.job for t in s.ready()] == [2]
    s.finish(second[1])
    assert s.devices[0].checks.keys() == {2}


def test_a_stage_that_leaves_before_it_asks_for_its_place_frees_its_slot_ahead():
    s = Scheduler(["0"], jobs=4, share=1, ahead=1, turns=True)
    for job in range(3):
        s.add(job, stages=["check"])
    started = {t.job: t for t in s.ready()}
    assert set(started) == {0, 1}   # one place and one ahead
    s.leave(started[1])             # ended its session before it asked (a collection error, say)
    assert [t.job for t in s.ready()] == [2]
    s.enter(started[0])
    assert s.admits() == [0]


@contextmanager
def _environ(names: dict):
    """`names` set in os.environ for the block (a child's channels, in a stand-in run in this process)."""
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_in_a_pool_a_stage_that_leaves_its_device_lets_the_next_turn_begin_during_its_exit(tmp_path):
    import time

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool
    from pytest_cudaopt.run import turn as turns

    spans: list[tuple[str, str, float, float]] = []   # (what, workdir, start, end)

    def stage(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        began = time.monotonic()
        if place is not None:
            turns.wait(place.folder)
        if stage == "perf":   # as a perf child does: its turn, then leaves its device, then a long exit
            spans.append(_timed_turn(turn, copy.name))
            with _environ({**place.env, **turn.env}):
                turns.leave()
            exit_began = time.monotonic()
            time.sleep(0.4)
            spans.append(("exit", copy.name, exit_began, time.monotonic()))
        return _passed(stage, time.monotonic() - began)

    workdirs = _workdirs(tmp_path, 3)
    options = Options(jobs=3, share=3, cache_dir=None, fork=False, scratch=tmp_path / "scratch", turns=True)
    found = list(LocalPool(workdirs, options, DeviceSet(["0"]), run_stage=stage).lines())
    assert len(found) == 3 and all(line["passed"] for line in found)
    turn_spans = [s for s in spans if s[0] == "turn"]
    exits = [s for s in spans if s[0] == "exit"]
    overlapped = [(t[1], e[1]) for t in turn_spans for e in exits if t[1] != e[1] and t[2] < e[3] and t[3] > e[2]]
    assert overlapped, "every turn waited for the exit of the perf stage before it"
    for line in found:   # the turn ends as the stage leaves, and its exit is counted apart
        seconds = line["seconds"]
        assert 0.1 <= seconds["perf_turn"] < 0.35 and seconds["perf_exit"] >= 0.35, seconds


def test_in_a_pool_stages_start_up_ahead_of_their_places_and_no_more_than_share_hold_one_at_once(tmp_path):
    import threading
    import time

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool
    from pytest_cudaopt.run import turn as turns

    lock = threading.Lock()
    started, placed, most = set(), set(), {"started": 0, "placed": 0}

    def stage(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        if place is None:
            return _passed(stage)
        key = (copy.name, stage)
        with lock:
            started.add(key)
            most["started"] = max(most["started"], len(started))
        time.sleep(0.1)   # start-up
        turns.wait(place.folder)
        with lock:
            placed.add(key)
            most["placed"] = max(most["placed"], len(placed))
        time.sleep(0.1)
        if turn is not None:
            turns.wait(turn.folder)
        with lock:
            started.discard(key)
            placed.discard(key)
        return _passed(stage)

    options = Options(jobs=8, share=2, ahead=2, cache_dir=None, fork=False, scratch=tmp_path / "scratch")
    found = list(LocalPool(_workdirs(tmp_path, 8), options, DeviceSet(["0"]), run_stage=stage).lines())
    assert len(found) == 8 and all(line["passed"] for line in found)
    assert most == {"started": 4, "placed": 2}, most


def test_a_perf_stage_that_ends_with_no_verdict_before_its_turn_beside_checks_is_judged_again_alone(tmp_path):
    """Before its turn a perf child runs no candidate code: an out-of-memory there is the stages' beside it."""
    import threading
    import time

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool
    from pytest_cudaopt.judge.stages import StageResult
    from pytest_cudaopt.run import turn as turns

    perf_runs: list[tuple[str, bool]] = []   # (workdir, whether a check ran beside it)
    checks, lock = set(), threading.Lock()

    def stage(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        if place is not None:
            turns.wait(place.folder)
        if stage == "check":
            with lock:
                checks.add(copy.name)
            time.sleep(0.4 if copy.name == "w1" else 0.05)
            with lock:
                checks.discard(copy.name)
        if stage == "perf":
            time.sleep(0.1)
            with lock:
                perf_runs.append((copy.name, bool(checks)))
            if copy.name == "w0" and len(perf_runs) == 1:   # prepared beside w1's check, short of memory
                failed = {**_passed(stage).report, "passed": False}
                return StageResult(stage, "error", 0.1, exit_code=70, report=failed,
                                   reason="not the candidate's fault but the harness's: test_speedup failed: "
                                          "torch.AcceleratorError: CUDA error: out of memory")
            turns.wait(turn.folder)
        return _passed(stage)

    workdirs = _workdirs(tmp_path, 2)
    options = Options(jobs=2, share=2, cache_dir=None, fork=False, scratch=tmp_path / "scratch", turns=True)
    found = {Path(line["workdir"]).name: line for line in LocalPool(workdirs, options, DeviceSet(["0"]),
                                                                     run_stage=stage).lines()}
    assert perf_runs[0] == ("w0", True), perf_runs          # it did run beside a check the first time
    assert [run for run in perf_runs if run[0] == "w0"] == [("w0", True), ("w0", False)], perf_runs
    assert (found["w0"]["status"], found["w0"]["passed"]) == ("judged", True), found["w0"]["reason"]
    note = found["w0"]["stages"]["perf"]["note"]
    assert "ended before its turn beside other stages on 0" in note and "CUDA error: out of memory" in note, note
    assert "judged again alone" in note and found["w1"]["passed"]
    assert found["w0"]["seconds"]["perf_again_alone"] >= 0.1 and "perf_again_alone" not in found["w1"]["seconds"]


def test_a_perf_stage_kept_from_its_verdict_by_the_environment_after_its_turn_is_judged_again_alone(tmp_path):
    """A perf stage whose timing gate found no device memory beside a hog (its child blames the environment, exit
    75) had its turn: that stage goes again alone on an idle device, not the whole workdir, and its line is the
    alone attempt's."""
    import threading

    from pytest_cudaopt.judge.devices import DeviceSet
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.pool import LocalPool
    from pytest_cudaopt.judge.stages import StageResult
    from pytest_cudaopt.run import turn as turns

    perf_runs: list[tuple[str, bool]] = []   # (workdir, whether another stage held a place beside it)
    placed, lock = set(), threading.Lock()

    def stage(stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        if place is not None:
            turns.wait(place.folder)
            with lock:
                placed.add((copy.name, stage))
                if stage == "perf":   # placed beside another workdir's stage?
                    perf_runs.append((copy.name, any(w != copy.name for w, _ in placed)))
        try:
            if stage == "check":
                time.sleep(0.4 if copy.name == "w1" else 0.05)
            if stage == "perf":
                turns.wait(turn.folder)
                if copy.name == "w0" and len(perf_runs) == 1:
                    kept = {**_passed(stage).report, "passed": False, "blame": "environment"}
                    return StageResult(stage, "error", 0.1, exit_code=75, report=kept,
                                       reason="not the candidate's fault but the environment's: test_speedup failed: "
                                              "its timing gate was not set up: CUDA error: out of memory")
            return _passed(stage)
        finally:
            with lock:
                placed.discard((copy.name, stage))

    workdirs = _workdirs(tmp_path, 2)
    options = Options(jobs=2, share=2, cache_dir=None, fork=False, scratch=tmp_path / "scratch", turns=True)
    found = {Path(line["workdir"]).name: line for line in LocalPool(workdirs, options, DeviceSet(["0"]),
                                                                     run_stage=stage).lines()}
    assert [run for run in perf_runs if run[0] == "w0"] == [("w0", True), ("w0", False)], perf_runs
    w0 = found["w0"]
    assert (w0["status"], w0["passed"], w0["blame"], w0.get("attempts", 1)) == ("judged", True, None, 1), w0
    note = w0["stages"]["perf"]["note"]
    assert "was kept from a verdict beside other stages on 0" in note and "judged again alone" in note, note
    assert w0["seconds"]["perf_again_alone"] >= 0.1 and found["w1"]["passed"]


def _schedule_replay():
    """benchmarks/schedule_replay.py as a module."""
    import sys

    from support import REPO_ROOT

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import schedule_replay
    finally:
        sys.path.pop(0)
    return schedule_replay


def test_a_runs_stage_times_replayed_through_the_scheduler_give_the_wall_time_worked_out_by_hand(tmp_path):
    """benchmarks/schedule_replay.py: two workdirs (build 1 s, policy 1 s, check 2 s, perf 1 s before its turn, a
    1 s turn) and a build failure. Both check at once (share 2), prepare at once, then take their turns one after
    the other: 7 s, the second turn waiting 1 s. With one place on the GPU everything runs one at a time."""
    schedule_replay = _schedule_replay()
    stages = {"build": {"status": "ok"}, "policy": {"status": "ok"}, "check": {"status": "ok"}, "perf": {"status": "ok"}}
    seconds = {"build": 1.0, "policy": 1.0, "check": 2.0, "perf": 3.5, "perf_wait": 1.5, "perf_turn": 1.0}
    lines = [{"stages": stages, "seconds": seconds}] * 2 + [
        {"stages": {"build": {"status": "build-failed"}, "policy": {"status": "not-run"}}, "seconds": {"build": 0.5}}]
    path = tmp_path / "judge.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    works = schedule_replay.load(path)
    assert [w.stages for w in works] == [["build", "policy", "check", "perf"]] * 2 + [["build"]]
    assert works[0].seconds["perf_prepare"] == 1.0
    got = schedule_replay.replay(works, share=2, jobs=2)
    assert (got["wall_s"], got["turns"], got["waited_s"]) == (7.0, 2, 1.0)
    alone = schedule_replay.replay(works, share=1, jobs=2)   # w0's check and perf (2 s), then w1's: 2 + 4 + 4
    assert (alone["wall_s"], alone["waited_s"]) == (10.0, 0.0)
    # With places: a check's start-up (1 s) holds no place with --ahead; its time in one is what is left of it
    # once its wait (0.5 s) is taken off. One place: 2 + (1 + 1.5) * 2 without ahead, 2 + 1 + 1.5 * 2 with it.
    placed = {"build": 1.0, "policy": 1.0, "check": 3.0, "check_before_place": 1.0, "check_place_wait": 0.5}
    path.write_text("".join(json.dumps({"stages": {k: stages[k] for k in ("build", "policy", "check")},
                                        "seconds": placed}) + "\n" for _ in range(2)))
    works = schedule_replay.load(path)
    assert (works[0].seconds["check_before"], works[0].seconds["check"]) == (1.0, 1.5)
    assert schedule_replay.replay(works, share=1, jobs=2)["wall_s"] == 7.0
    assert schedule_replay.replay(works, share=1, jobs=2, ahead=1)["wall_s"] == 6.0
    # A check that leaves its place 0.5 s before its end (its exit): the second check's place begins then.
    # One place, no ahead: 2 + (1 + 1.0) + (1 + 1.0) + 0.5 = 6.5 s (each start-up holds the place).
    path.write_text("".join(json.dumps({"stages": {k: stages[k] for k in ("build", "policy", "check")},
                                        "seconds": {**placed, "check_exit": 0.5}}) + "\n" for _ in range(2)))
    works = schedule_replay.load(path)
    assert (works[0].seconds["check"], works[0].seconds["check_exit"]) == (1.0, 0.5)
    assert schedule_replay.replay(works, share=1, jobs=2)["wall_s"] == 6.5


def test_the_replay_replays_an_attempt_judged_again_placed_or_alone(tmp_path):
    """A check judged again holds its place for its first attempt's seconds, then goes back as the judge placed it:
    among the others (as without the attempt), or alone, after the GPU drained."""
    schedule_replay = _schedule_replay()
    stages = {s: {"status": "ok"} for s in ("build", "policy", "check")}

    def wall(**again) -> float:   # w0's check: 1.5 s, after an attempt of 2 s; w1's: 4 s; both placed at 2 s
        lines = [{"stages": stages, "seconds": {"build": 1.0, "policy": 1.0, "check": 1.5 + sum(again.values()),
                                                **again}},
                 {"stages": stages, "seconds": {"build": 1.0, "policy": 1.0, "check": 4.0}}]
        path = tmp_path / "judge.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        works = schedule_replay.load(path)
        assert works[0].seconds["check"] == 1.5
        return schedule_replay.replay(works, share=2, jobs=2)["wall_s"]

    assert wall() == 6.0                       # 2 + 4 (w1), w0 ends at 3.5
    assert wall(check_again=2.0) == 6.0        # w0: 2-4, again 4-5.5 beside w1
    assert wall(check_again_alone=2.0) == 7.5  # w0: 2-4, alone once w1 ends at 6: 6-7.5
    assert wall(check_again=1.0, check_again_alone=1.0) == 7.5   # 2-3, 3-4, then alone 6-7.5


def test_the_replay_replays_a_workdir_judged_again_whole_its_earlier_attempt_first_then_ahead_of_the_queue(tmp_path):
    """A line's `earlier` attempts (with their seconds) run first; when one ends, the workdir goes again before the
    workdirs still waiting. One place: w0's first attempt checks 2-4 s, w1's check 4-6 s while w0 builds again (4-5)
    and checks its policy (5-6), then w0's check 6-7 s. An `earlier` of an older run, without seconds, is not
    replayed."""
    schedule_replay = _schedule_replay()
    stages = {s: {"status": "ok"} for s in ("build", "policy", "check")}
    first = {"status": "judged", "blame": "environment", "reason": "check: busy",
             "seconds": {"copy": 0.0, "build": 1.0, "policy": 1.0, "check": 2.0, "total": 4.0}}

    def wall(*earlier: dict) -> float:
        lines = [{"stages": stages, "seconds": {"build": 1.0, "policy": 1.0, "check": 1.0},
                  **({"earlier": list(earlier)} if earlier else {})},
                 {"stages": stages, "seconds": {"build": 1.0, "policy": 1.0, "check": 2.0}}]
        path = tmp_path / "judge.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        works = schedule_replay.load(path)
        got = schedule_replay.replay(works, share=1, jobs=2)
        assert got["per_hour"] == pytest.approx(2 * 3600 / got["wall_s"])   # workdirs, not attempts
        return got["wall_s"]

    assert wall() == 5.0                                  # w0's check 2-3, w1's 3-5
    assert wall(first) == 7.0
    assert wall({k: v for k, v in first.items() if k != "seconds"}) == 5.0
    # twice judged again: 2-4 (w0), 4-6 (w1; w0 builds 4-5, policy 5-6), 6-8 (w0 again), then build 8-9,
    # policy 9-10, check 10-11
    assert wall(first, first) == 11.0


def test_the_replay_pauses_a_check_asked_while_it_starts_up_in_its_place_at_its_first_item(tmp_path):
    """Without --ahead a check holds its place from its start. w0's perf asks for its turn at 3 s while w1's check
    still starts up (2-5 s): w1 pauses on entering its place, the turn runs 5-6 s, then w1's check 6-7 s."""
    schedule_replay = _schedule_replay()
    ok = {"status": "ok"}
    lines = [{"stages": {"build": ok, "policy": ok, "check": ok, "perf": ok},
              "seconds": {"build": 1.0, "policy": 1.0, "check": 0.5, "perf": 1.5, "perf_turn": 1.0}},
             {"stages": {"build": ok, "policy": ok, "check": ok},
              "seconds": {"build": 1.0, "policy": 1.0, "check": 4.0, "check_before_place": 3.0}}]
    path = tmp_path / "judge.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    got = schedule_replay.replay(schedule_replay.load(path), share=2, jobs=2, ahead=0, pause=0.8)
    assert (got["wall_s"], got["turns"], got["waited_s"]) == (7.0, 1, 2.0)
