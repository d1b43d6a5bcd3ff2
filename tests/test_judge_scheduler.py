"""The judge's scheduler on a fake device list: no processes, a scripted clock."""

from __future__ import annotations

import pytest

from pytest_cudaopt.judge.scheduler import OVERHEAD_BYTES, Scheduler, Task

GiB = 1 << 30


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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


def test_a_perf_stage_has_its_gpu_to_itself():
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
