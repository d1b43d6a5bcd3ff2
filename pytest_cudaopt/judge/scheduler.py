"""Which stage of which workdir runs where next: CPU slots for builds, devices for judging, a perf stage alone on its device. No processes here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

# The stages of a workdir, in order. A check that ran out of device memory beside other checks
# runs again alone, as a perf stage does (pool.py decides which run again, and how).
STAGES = ("build", "policy", "check", "perf")
CPU_STAGES = frozenset({"build", "policy"})
OVERHEAD_BYTES = 2 << 30   # what a judging process holds besides its cases (the CUDA context, workspaces)


@dataclass(frozen=True)
class Task:
    """One stage of one workdir (`job`, its index), on `device` (None for a CPU stage)."""

    job: int
    stage: str
    device: str | None = None


@dataclass
class Device:
    """A GPU (or, for CPU workdirs, a CPU slot): what runs on it and how long it was busy."""

    name: str
    memory: int | None = None                               # bytes; None: only the count limits sharing
    checks: dict[int, int | None] = field(default_factory=dict)   # job -> memory it was given (placed)
    preparing: list[int] = field(default_factory=list)       # started ahead, without a place yet (CPU only)
    asking: list[int] = field(default_factory=list)          # of them, those that asked for their place
    alone: int | None = None                                 # the job that has it to itself (perf, a check retried)
    draining: bool = False                                   # a stage that runs alone waits for it: no new checks
    wanting: list[int] = field(default_factory=list)         # perf stages among `checks` waiting for their turn
    pausing: set[int] = field(default_factory=set)           # checks asked to pause for a turn (`pause`)
    paused: set[int] = field(default_factory=set)            # of them, those paused
    busy_s: float = 0.0
    busy_since: float | None = None

    @property
    def idle(self) -> bool:
        return not self.checks and self.alone is None


@dataclass
class _Job:
    stages: list[str]
    problem: str | None
    waiting: str | None = None      # the stage ready to start
    running: Task | None = None
    alone: bool = False             # its check runs alone (it ran out of memory beside others)
    first: bool = False             # its stages go before those of jobs added without `first` (judged again)


class Scheduler:
    """Assigns stages to CPU slots (`jobs` at once) and devices. A device takes up to `share` checks while their
    needs fit, or one stage alone (perf, a check retried), which goes first and drains a device when none is idle.
    With `turns`, a perf stage starts as a check does and has its device alone once it asks (`want`): the device
    drains, and `grants` gives it the turn when every other stage there waits for one too.
    With `pause`, a turn waits for the checks placed there to pause between their items (`pauses`, `paused`),
    not to end, and they go on (`resumes`) once no turn is held or asked for there.
    With `ahead`, up to `share + ahead` check and perf stages start on a device without a place: they start up
    on the CPU and ask for one (`enter`) before their first use of it; `admits` places them while they fit
    (with 0 a stage is placed at its start; its ask is answered at once). `clock`: tests."""

    def __init__(self, devices: Sequence[str], *, jobs: int = 2, share: int = 2, turns: bool = False,
                 ahead: int = 0, pause: bool = False, memory: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if not devices:
            raise ValueError("the scheduler needs at least one device (a GPU or a CPU slot)")
        if jobs < 1 or share < 1 or ahead < 0:
            raise ValueError(f"jobs and share must be at least 1, ahead at least 0 (got jobs={jobs}, share={share}, "
                             f"ahead={ahead})")
        self.devices = [Device(str(d), (memory or {}).get(str(d))) for d in devices]
        self.jobs, self.share, self.turns, self.ahead, self.clock = jobs, share, turns, ahead, clock
        self.pause = pause and turns
        self.started = clock()
        self._jobs: dict[int, _Job] = {}
        self._cpu_running = 0
        self.need: dict[str, int] = {}   # problem -> the memory one check may take
        self._peaks: dict[str, int] = {}  # problem -> the largest measured (peak + overhead)
        self._measured: set[str] = set()  # problems whose need a complete check measured
        self._shared: set[int] = set()    # jobs whose running check had another check beside it
        self._now: list[int] = []          # jobs that asked for their turn with their device alone already
        self._entered: list[int] = []      # jobs that asked for their place with one already

    def add(self, job: int, problem: str | None = None, stages: Sequence[str] = STAGES, first: bool = False) -> None:
        """A job whose `stages` run in order; `first`: its stages start before the waiting ones of jobs added
        without it (a workdir judged again), else in the order the jobs were added."""
        if job in self._jobs:
            raise ValueError(f"job {job} was added twice")
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise ValueError(f"unknown stages {unknown} (the stages are {', '.join(STAGES)})")
        self._jobs[job] = _Job(list(stages), problem, waiting=stages[0], first=first)

    @property
    def done(self) -> bool:
        return all(j.waiting is None and j.running is None for j in self._jobs.values())

    def waiting(self) -> list[tuple[int, str]]:
        """(job, its stage ready to start), in the order they start: jobs added `first`, then by number."""
        found = [(n, j.waiting) for n, j in self._jobs.items() if j.waiting is not None]
        return sorted(found, key=lambda w: (not self._jobs[w[0]].first, w[0]))

    def ready(self) -> list[Task]:
        """The tasks that may start now, marked running: the stages that run alone, checks, CPU stages."""
        started: list[Task] = []
        waiting = self.waiting()
        for job, stage in [w for w in waiting if self._sole(*w)]:
            device = next((d for d in self.devices if d.idle and d.draining), None) or next(
                (d for d in self.devices if d.idle), None)
            if device is None:
                self._drain()
                continue
            device.alone = job
            started.append(self._start(job, stage, device))
        self._release_drains()
        for job, stage in [w for w in waiting if w[1] in ("check", "perf") and not self._sole(*w)]:
            if self.ahead:
                device = self._roomiest()
                if device is not None:
                    device.preparing.append(job)
                    started.append(self._start(job, stage, device))
                continue
            device = self._fitting(self._jobs[job].problem)
            if device is not None:
                self._place(job, device)
                started.append(self._start(job, stage, device))
        for job, stage in [w for w in waiting if w[1] in CPU_STAGES]:
            if self._cpu_running >= self.jobs:
                break
            self._cpu_running += 1
            started.append(self._start(job, stage, None))
        return started

    def _place(self, job: int, device: Device) -> None:
        if device.checks:   # beside others: a shortfall of either is no candidate's
            self._shared.update([*device.checks, job])
        device.checks[job] = self._need(self._jobs[job].problem, device)

    def _roomiest(self) -> Device | None:
        """The device with the fewest check and perf stages, placed or preparing, if it takes one more ahead."""
        room = [d for d in self.devices if len(d.checks) + len(d.preparing) < self.share + self.ahead]
        return min(room, key=lambda d: len(d.checks) + len(d.preparing)) if room else None

    def enter(self, task: Task) -> None:
        """The running stage `task` asks for its place on its device (`admits` gives it)."""
        device = next(d for d in self.devices if d.name == task.device)
        if task.job in device.preparing:
            if task.job not in device.asking:
                device.asking.append(task.job)
        elif task.job not in self._entered:   # placed at its start (alone, or with no `ahead`)
            self._entered.append(task.job)

    def admits(self) -> list[int]:
        """The jobs whose place begins now: asked, in order, while they fit (no stage alone, not draining)."""
        admitted, self._entered = self._entered, []
        for device in self.devices:
            while device.asking and self._fits(device, self._jobs[device.asking[0]].problem):
                job = device.asking.pop(0)
                device.preparing.remove(job)
                self._touch(device)
                self._place(job, device)
                self._touch(device)
                admitted.append(job)
        return admitted

    def _sole(self, job: int, stage: str) -> bool:
        """The stage has its device to itself from its start: perf without turns, or a stage retried alone."""
        return self._jobs[job].alone or (stage == "perf" and not self.turns)

    def want(self, task: Task) -> None:
        """The running perf stage `task` asks for its device alone: the device drains until `grants` gives it."""
        device = next(d for d in self.devices if d.name == task.device)
        if device.alone == task.job:   # it runs alone already (retried alone)
            self._now.append(task.job)
        elif task.job in device.checks and task.job not in device.wanting:   # it drains (_release_drains)
            device.wanting.append(task.job)

    def grants(self) -> list[int]:
        """The jobs whose turn begins now: on a device where every other stage waits for its turn too (or,
        with `pause`, is a paused check)."""
        granted, self._now = self._now, []
        for device in self.devices:
            if device.alone is None and device.wanting and set(device.checks) <= {*device.wanting, *device.paused}:
                device.alone = device.wanting.pop(0)
                granted.append(device.alone)
        return granted

    def leave(self, task: Task) -> None:
        """The running stage `task` is done with its device (its items over, its workers stopped): its place and
        its turn end now, while its process exits. `finish` then ends the stage."""
        job = self._jobs[task.job]
        if task.device is None or job.running != task:
            return
        device = next(d for d in self.devices if d.name == task.device)
        self._touch(device)
        device.checks.pop(task.job, None)
        for waiting in (device.preparing, device.asking, device.wanting):
            if task.job in waiting:
                waiting.remove(task.job)
        device.pausing.discard(task.job)
        device.paused.discard(task.job)
        if device.alone == task.job:
            device.alone = None
        self._touch(device)

    def pauses(self) -> list[int]:
        """The placed stages to ask to pause now, on a device where a turn is asked for or held (`pause` only): its
        checks, and its perf stages still preparing (a turn waited for their whole preparation)."""
        asked: list[int] = []
        for device in self.devices if self.pause else ():
            if device.wanting or device.alone is not None:
                for job in device.checks:
                    if (self._jobs[job].running is not None and job not in device.pausing
                            and job not in device.wanting and job != device.alone):
                        device.pausing.add(job)
                        asked.append(job)
        return asked

    def paused(self, task: Task) -> None:
        """The stage `task`, asked to pause, has paused (no work of its own on its device until it resumes)."""
        device = next(d for d in self.devices if d.name == task.device)
        if task.job in device.pausing:
            device.paused.add(task.job)

    def resumes(self) -> list[int]:
        """The stages asked to pause that go on now: on a device where no turn is held or asked for."""
        going: list[int] = []
        for device in self.devices:
            if device.pausing and not device.wanting and device.alone is None:
                going.extend(sorted(device.pausing))
                device.pausing.clear()
                device.paused.clear()
        return going

    def _start(self, job: int, stage: str, device: Device | None) -> Task:
        if device is not None:
            self._touch(device)
        task = Task(job, stage, device.name if device is not None else None)
        self._jobs[job].running, self._jobs[job].waiting = task, None
        return task

    def _need(self, problem: str | None, device: Device) -> int | None:
        if problem in self.need:
            return self.need[problem]
        return device.memory // self.share if device.memory else None

    def _fitting(self, problem: str | None) -> Device | None:
        """The device with the fewest checks that takes one more (no perf, not draining, memory fits)."""
        fits = [device for device in self.devices if self._fits(device, problem)]
        return min(fits, key=lambda d: len(d.checks)) if fits else None

    def _fits(self, device: Device, problem: str | None) -> bool:
        """Whether `device` takes one more check of `problem` now (no perf, not draining, memory fits)."""
        if device.alone is not None or device.draining or len(device.checks) >= self.share:
            return False
        need = self._need(problem, device)
        used = sum(n or 0 for n in device.checks.values())
        return not (device.memory and need is not None and device.checks and used + need > device.memory)

    def _drain(self) -> None:
        """One more device (the fewest checks first) stops taking checks, while fewer drain than stages wait alone."""
        if sum(d.draining for d in self.devices) >= sum(1 for w in self.waiting() if self._sole(*w)):
            return
        candidates = [d for d in self.devices if not d.draining and d.alone is None and not d.idle]
        if candidates:
            min(candidates, key=lambda d: len(d.checks)).draining = True

    def _release_drains(self) -> None:
        """A device drains only while a stage waits to run alone (and never while one does)."""
        waiting = sum(1 for w in self.waiting() if self._sole(*w))
        for device in self.devices:
            if device.wanting:
                device.draining = True
            elif device.draining and (device.alone is not None or waiting <= 0):
                device.draining = False
            elif device.draining:
                waiting -= 1

    def expect(self, problem: str | None, need_bytes: int) -> None:
        """A problem's estimated check memory (the build's), used until a complete check measures its peak."""
        if problem is not None and problem not in self.need:
            self.need[problem] = max(need_bytes, self._peaks.get(problem, 0))

    def shared(self, task: Task) -> bool:
        """Whether the running check `task` had another check beside it on its device at any time."""
        return task.job in self._shared

    def finish(self, task: Task, *, proceed: bool = True, peak_bytes: int | None = None, complete: bool = False,
               retry: bool = False, retry_alone: bool = False) -> str | None:
        """Mark `task` done; the job's next stage, or None when it is over. `retry`: the same stage again, placed as
        any; `retry_alone`: the same stage again, alone. The first `complete` check's `peak_bytes` replaces the
        estimate."""
        job = self._jobs[task.job]
        if job.running != task:
            raise ValueError(f"{task} is not running")
        job.running, alone = None, job.alone
        job.alone = False
        self._shared.discard(task.job)
        for answered in (self._entered, self._now):
            if task.job in answered:
                answered.remove(task.job)
        if task.device is None:
            self._cpu_running -= 1
        else:
            device = next(d for d in self.devices if d.name == task.device)
            self._touch(device)
            device.checks.pop(task.job, None)
            for waiting in (device.preparing, device.asking):
                if task.job in waiting:
                    waiting.remove(task.job)
            if task.job in device.wanting:
                device.wanting.remove(task.job)
            device.pausing.discard(task.job)
            device.paused.discard(task.job)
            if device.alone == task.job:
                device.alone = None
            self._touch(device)
        if task.stage == "check" and peak_bytes is not None and job.problem is not None:
            self._learn(job.problem, peak_bytes + OVERHEAD_BYTES, complete)
        if retry_alone and not alone:
            job.waiting, job.alone = task.stage, True
            return job.waiting
        if retry:
            job.waiting = task.stage
            return job.waiting
        following = job.stages[job.stages.index(task.stage) + 1:] if proceed else []
        job.waiting = following[0] if following else None
        return job.waiting

    def _learn(self, problem: str, measured: int, complete: bool) -> None:
        self._peaks[problem] = max(self._peaks.get(problem, 0), measured)
        if complete and problem not in self._measured:
            self._measured.add(problem)
            self.need[problem] = self._peaks[problem]
        else:
            self.need[problem] = max(self.need.get(problem, 0), measured)

    def _touch(self, device: Device) -> None:
        """Account busy time up to now (called before and after every change of a device)."""
        now = self.clock()
        if device.busy_since is not None:
            device.busy_s += now - device.busy_since
        device.busy_since = None if device.idle else now

    def busy_fraction(self) -> dict[str, float]:
        """Each device's busy share of the wall time since the scheduler started."""
        now = self.clock()
        wall = max(now - self.started, 1e-9)
        return {d.name: min(1.0, (d.busy_s + (now - d.busy_since if d.busy_since is not None else 0.0)) / wall)
                for d in self.devices}
