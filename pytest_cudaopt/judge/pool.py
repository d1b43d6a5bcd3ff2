"""The local engine: every workdir through its stages, each a fresh child on a CPU slot or a device the scheduler gives it; one line per workdir as it finishes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import queue
import secrets
import shlex
import shutil
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from pytest_cudaopt.judge import copies, lines, runner
from pytest_cudaopt.judge.devices import DeviceSet, cpu_slots, gpus
from pytest_cudaopt.judge.options import Options, result_key
from pytest_cudaopt.judge.scheduler import STAGES, Scheduler, Task
from pytest_cudaopt.judge.stages import (FAILED, OK, StageResult, bytecode_folder, common_environment, run_stage,
                                         shortfall)
from pytest_cudaopt.run import zygote
from pytest_cudaopt.run.scratch import own_folder
from pytest_cudaopt.run.turn import PLACE, POLL_S, Pause, Turn

# The events of a fed pool besides a stage's end: a workdir added, no more to come, one workdir's
# children to end (a service's backstop), everything to end now (a service stopped); a perf stage's ask
# for its turn, a device stage's ask for its place, a check's pause (for a turn beside it), a device stage done
# with its device (before its exit).
_ADD, _CLOSE, _ABANDON, _STOP, _WANT, _ENTER, _PAUSED, _LEFT = (object() for _ in range(8))


@dataclass
class Job:
    """One workdir's way through the stages."""

    index: int
    workdir: Path
    folder: Path
    problem: str | None
    results: list[StageResult] = field(default_factory=list)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    started: float = field(default_factory=time.monotonic)
    content: str = ""
    notes: dict[str, str] = field(default_factory=dict)   # stage -> why it was judged again alone
    name: str = ""   # as the caller named it
    key: str | None = None   # the result key the caller computed (a Ray driver's), else from the copy
    id: object = None        # the submission's id in the line (as the caller gave it, else the index)
    began: float | None = None   # when its first stage started (before: queued)
    children: runner.Children = field(default_factory=runner.Children)   # its own, within the pool's
    turn: Turn | None = None   # its running perf stage's (the device alone once it asks)
    place: Turn | None = None  # its running check or perf stage's (a place on the device once it asks)
    pause: Pause | None = None  # its running check's or preparing perf stage's (paused for a turn beside it)

    @property
    def copy(self) -> Path:
        return self.folder / self.workdir.name

    @property
    def out(self) -> Path:
        """The children's reports and logs, beside the copy (never the copy itself, whatever the workdir's name)."""
        return self.folder / ("out" if self.workdir.name != "out" else "out.judge")


def _problem(workdir: Path) -> str | None:
    """The reference's content (candidates of one problem share a model.py): what memory needs are learned by."""
    try:
        return hashlib.sha256((workdir / "model.py").read_bytes()).hexdigest()[:16]
    except OSError:
        return None


class LocalPool:
    """Judges `workdirs` on this host. Iterate `lines()`; afterwards `busy` and `wall_s`. `fed`: more workdirs come
    while it runs (`add`, from any thread) until `close()`. `run_stage` replaces the stages' children (tests)."""

    def __init__(self, workdirs: Sequence[Path], options: Options, devices: DeviceSet | None = None,
                 on_event: Callable[..., None] | None = None, fed: bool = False, run_stage: Callable[..., StageResult] | None = None):
        self.workdirs = [Path(w) for w in workdirs]
        self.names = [str(w) for w in self.workdirs]
        self.options = options
        self.devices = devices or (cpu_slots(options.cpu_slots) if options.cpu else gpus(options.gpus))
        self.on_event = on_event or (lambda *args: None)
        self.busy: dict[str, float] = {}
        self.wall_s = 0.0
        self.children = runner.Children()
        self.fed = fed
        self._run_stage = run_stage
        self._events: queue.Queue = queue.Queue()   # (task, result) of a stage, or (_ADD, ...) and the like

    def add(self, workdir: Path, name: str | None = None, key: str | None = None, id: object = None,
            submitted: float | None = None, again: bool = False) -> None:
        """One more workdir for a `fed` pool (`submitted`: the monotonic time its queue time counts from; `again`:
        judged again, its stages go before those of the workdirs still queued)."""
        if not self.fed:
            raise ValueError("workdirs are added only to a pool made with fed=True")
        self._events.put((_ADD, (Path(workdir), name if name is not None else str(workdir), key, id, submitted,
                                 again)))

    def close(self) -> None:
        """No more workdirs: `lines()` ends once those added have their lines."""
        self._events.put((_CLOSE, None))

    def abandon(self, id: object) -> None:
        """End the children of the workdir added with `id` (its line, when it comes, says how it ended)."""
        self._events.put((_ABANDON, id))

    def stop(self, why: str) -> None:
        """End every child now; every workdir without its line gets a `cancelled` one, and `lines()` ends."""
        self._events.put((_STOP, why))

    def lines(self) -> Iterator[dict]:
        if not self.devices.names:
            if self.fed:
                raise ValueError("a pool fed workdirs needs at least one device")
            command = " ".join(shlex.quote(n) for n in self.names[:3]) + (" ..." if len(self.names) > 3 else "")
            why = (f"no GPU visible: for CPU workdirs, `cudaopt judge {command} -- --cudaopt-device=cpu` (or "
                   f"cudaopt_device = \"cpu\" in each workdir's pyproject.toml, as `cudaopt init --device cpu` "
                   f"writes); for GPUs, --gpus")
            for name in self.names:
                yield lines.unjudged(name, result_key(name, "", self.options), "error", why)
            return
        scheduler = Scheduler(self.devices.names, jobs=self.options.cpu_jobs, share=self.options.share,
                              memory=self.devices.memory, turns=self.options.turns, ahead=self.options.stages_ahead,
                              pause=self.options.pause)
        own_scratch = self.options.scratch is None
        scratch = own_folder("judge") if own_scratch else Path(self.options.scratch)
        start, offered = time.monotonic(), None
        try:   # from here on, whatever ends the pool removes its own scratch folder
            jobs: dict[int, Job] = {}
            for workdir, name in zip(self.workdirs, self.names):
                self._new_job(scheduler, jobs, scratch, workdir, name, None, None, None, False)
            offered = self._offer_zygote()
            start = time.monotonic()
            yield from self._loop(scheduler, jobs, scratch)
        finally:
            self.children.stop_all()
            if offered is not None:
                offered.stdin.close()  # the zygote ends, and kills any fork still running
                offered.wait()
            self.busy, self.wall_s = scheduler.busy_fraction(), time.monotonic() - start
            if own_scratch and not self.options.keep:
                shutil.rmtree(scratch, ignore_errors=True)

    def _offer_zygote(self):
        """A zygote that forks each stage's child and its worker; None where one is offered already or none starts."""
        if self._run_stage is not None or self.options.zygote:
            return None
        if os.environ.get(zygote.ENV):
            self.options = dataclasses.replace(self.options, zygote=os.environ[zygote.ENV])
            return None
        name = f"cudaopt-judge-{os.getpid()}-{secrets.token_hex(4)}"
        # its children read the bytecode it writes only once it runs: else their install's own
        with_bytecode = dataclasses.replace(self.options, bytecode=bytecode_folder(self.options))
        try:
            env = copies.scrubbed_env(common_environment(with_bytecode), keep=self.options.keep_env)
            proc = zygote.start(name, env)
        except OSError:
            return None
        self.options = dataclasses.replace(with_bytecode, zygote=name)
        return proc

    def _new_job(self, scheduler: Scheduler, jobs: dict[int, Job], scratch: Path, workdir: Path, name: str,
                 key: str | None, id: object, submitted: float | None, again: bool) -> None:
        index = len(jobs)
        job = Job(index, workdir, scratch / f"{index:05d}", _problem(workdir), name=name, key=key,
                  id=index if id is None else id, children=runner.Children(self.children))
        if submitted is not None:
            job.started = submitted
        jobs[index] = job
        scheduler.add(index, job.problem, first=again)

    def _loop(self, scheduler: Scheduler, jobs: dict[int, Job], scratch: Path) -> Iterator[dict]:
        done: set[int] = set()
        closed = not self.fed
        told = {_WANT: scheduler.want, _ENTER: scheduler.enter, _PAUSED: scheduler.paused, _LEFT: scheduler.leave}
        try:
            # an add made while the last line was out (a judge-again) is taken before the loop ends
            while not (closed and scheduler.done and self._events.empty()):
                for task in scheduler.ready():
                    if jobs[task.job].began is None:
                        jobs[task.job].began = time.monotonic()
                    self.on_event("start", jobs[task.job], task)
                    self._channels(jobs[task.job], task)
                    threading.Thread(target=self._work, args=(jobs[task.job], task, self._events), daemon=True).start()
                for job in scheduler.admits():
                    jobs[job].place.grant()
                for job in scheduler.grants():
                    jobs[job].turn.grant()
                for job in scheduler.pauses():
                    jobs[job].pause.ask()
                for job in scheduler.resumes():
                    jobs[job].pause.release()
                task, result = self._events.get()
                if task is _CLOSE:
                    closed = True
                    continue
                if task is _ADD:
                    self._new_job(scheduler, jobs, scratch, *result)
                    continue
                if task in told:   # a running stage's word on its channels
                    told[task](result)
                    continue
                if task is _ABANDON:
                    for job in jobs.values():
                        if job.id == result and job.index not in done:
                            threading.Thread(target=job.children.stop_all, daemon=True).start()
                    continue
                if task is _STOP:
                    yield from self._cancelled(jobs, done, result)
                    return
                line = self._finished(scheduler, jobs[task.job], task, result)
                if line is not None:
                    done.add(task.job)
                    yield line
        except KeyboardInterrupt:
            yield from self._cancelled(jobs, done, "the judge was interrupted")
            raise

    def _cancelled(self, jobs: dict[int, Job], done: set[int], why: str) -> Iterator[dict]:
        """Every child ended, and a `cancelled` line for each workdir without one (judged yet or not)."""
        self.children.stop_all()
        for job in jobs.values():
            if job.index not in done:
                done.add(job.index)
                yield self._line(job, status="cancelled", reason=lines.cancelled_reason(why, job.began is not None))

    def _channels(self, job: Job, task: Task) -> None:
        """The stage's channels with its child (run/turn.py), made before it starts: the scheduler may grant, admit
        or ask it to pause (a stage placed at its start) before its thread runs."""
        device = task.device is not None
        job.turn = Turn(job.out / "turn") if task.stage == "perf" and self.options.turns else None
        job.place = Turn(job.out / f"{task.stage}-place", PLACE) if device else None
        job.pause = (Pause(job.out / f"{task.stage}-pause") if device and task.stage in ("check", "perf")
                     and self.options.pause and self.options.turns else None)

    def _work(self, job: Job, task: Task, events: queue.Queue) -> None:
        try:
            if task.stage == "build":
                copied = time.monotonic()
                job.out.mkdir(parents=True, exist_ok=True)
                job.content = copies.private_copy(job.workdir, job.copy)
                job.seconds["copy"] = time.monotonic() - copied
            turn, place, pause = job.turn, job.place, job.pause
            ended = threading.Event()
            if turn is not None:   # asked for once ready (run/turn.py)
                threading.Thread(target=self._watch_turn, args=(turn, task, ended), daemon=True).start()
            if place is not None:
                threading.Thread(target=self._watch_place, args=(place, task, ended), daemon=True).start()
            if pause is not None:
                threading.Thread(target=self._watch_pause, args=(pause, task, ended), daemon=True).start()
            for part in ("before_place", "place_wait", "paused", "exit"):   # the attempt whose verdict counts
                job.seconds.pop(f"{task.stage}_{part}", None)
            began = time.monotonic()
            try:
                result = (self._run_stage or run_stage)(task.stage, job.copy, job.out, self.devices, task.device,
                                                        self.options, job.children, turn=turn, place=place,
                                                        pause=pause)
            finally:
                ended.set()
            if pause is not None and pause.total:
                job.seconds[f"{task.stage}_paused"] += pause.total
            if place is not None and place.asked_at is not None:   # of the stage's seconds: before its place, waiting
                job.seconds.update({f"{task.stage}_before_place": place.asked_at - began,
                                    f"{task.stage}_place_wait": place.waited()})
            if turn is not None:   # and for its turn, then holding the device alone (to its leaving)
                turn.left()
                job.seconds.update(perf_wait=turn.waited(), perf_turn=turn.held())
            if place is not None and place.left():   # its exit, after it left its device (seen late or not)
                job.seconds[f"{task.stage}_exit"] = time.monotonic() - place.left_at
        except (OSError, copies.CopyError) as exc:
            result = StageResult(task.stage, "error", reason=f"could not {'copy' if task.stage == 'build' else 'run'} "
                                                               f"{job.workdir}: {exc}")
        except Exception as exc:  # the judge's own bug: the workdir still gets its line
            result = StageResult(task.stage, "error", reason=f"the judge failed: {exc!r}")
        events.put((task, result))

    def _watch_turn(self, turn: Turn, task: Task, ended: threading.Event) -> None:
        while not ended.wait(POLL_S * 2):
            if turn.wanted():
                self._events.put((_WANT, task))
                return

    def _watch_place(self, place: Turn, task: Task, ended: threading.Event) -> None:
        """The stage's ask for its place, then its leaving it (its place and turn end before its exit): the
        scheduler hears of each; a stage may leave without having asked."""
        asked = False
        while not ended.wait(POLL_S * 2):
            if not asked and place.wanted():
                asked = True
                self._events.put((_ENTER, task))
            if place.left():
                self._events.put((_LEFT, task))
                return

    def _watch_pause(self, pause: Pause, task: Task, ended: threading.Event) -> None:
        """Each time the stage pauses as asked, the scheduler hears of it (its ask is the loop's)."""
        told = 0
        while not ended.wait(POLL_S * 2):
            if pause.number != told and pause.answered():
                told = pause.number
                self._events.put((_PAUSED, task))

    def _finished(self, scheduler: Scheduler, job: Job, task: Task, result: StageResult) -> dict | None:
        self.on_event("end", job, task, result)
        peaks = [r.get("data", {}).get("peak_bytes") for r in (result.report or {}).get("results", [])]
        peak = max((p for p in peaks if isinstance(p, int)), default=None) if task.stage == "check" else None
        short = shortfall(result)
        job.seconds[task.stage] += result.seconds
        # A perf stage that ended with no verdict before its turn did so beside other stages: not held against it.
        early = (task.stage == "perf" and job.turn is not None and job.turn.granted_at is None
                 and result.status not in (OK, FAILED))
        # A check its child could not judge for the environment's sake beside others (a shortfall among failures of
        # its own, say): that stage again, placed as the whole workdir's would be but without its build and policy;
        # alone if it is kept from its verdict a second time. A perf stage so kept (its timing gate found no device
        # memory beside a hog) goes alone at once.
        starved = result.status == "error" and (result.report or {}).get("blame") == "environment"
        if (short is not None or early or starved) and scheduler.shared(task):   # not the candidate's
            said = (result.reason or result.status).splitlines()[0]
            if short is not None:
                why = f"ran out of device memory on {task.device} beside other checks ({short.splitlines()[0]})"
            elif early:
                why = f"ended before its turn beside other stages on {task.device} ({said})"
            else:
                why = f"was kept from a verdict beside other stages on {task.device} ({said})"
                if task.stage == "check" and task.stage not in job.notes:   # placed as any check the first time
                    job.notes[task.stage] = f"{why}; judged again"
                    job.seconds[f"{task.stage}_again"] += result.seconds   # of its seconds: for a replay
                    scheduler.finish(task, peak_bytes=peak, retry=True)
                    return None
            earlier = f"{job.notes[task.stage]}; then it " if task.stage in job.notes else ""
            job.notes[task.stage] = f"{earlier}{why}; judged again alone on an idle device"
            job.seconds[f"{task.stage}_again_alone"] += result.seconds
            scheduler.finish(task, peak_bytes=peak, retry_alone=True)
            return None
        if short is not None and result.status == FAILED:   # with its device to itself: the workdir's own
            total = self.devices.memory.get(task.device) if task.device is not None else None
            size = f" ({total / (1 << 30):.2f} GiB in all)" if total else ""
            where = task.device if self.devices.cpu else f"GPU {task.device}"
            result.reason = (f"correctness ran out of device memory on {where}{size} with no other check beside it, "
                             f"so the shortfall is this workdir's: {short.splitlines()[0]}")
        result.note = job.notes.get(task.stage, "")
        job.results.append(result)
        proceed = result.status == OK or (result.status == FAILED and self.options.all_stages)
        if result.need_bytes is not None:
            scheduler.expect(job.problem, result.need_bytes)
        if scheduler.finish(task, proceed=proceed, peak_bytes=peak, complete=result.status == OK) is not None:
            return None
        for stage in STAGES[STAGES.index(task.stage) + 1:]:
            job.results.append(StageResult(stage, "not-run", reason=f"not run: the {task.stage} stage {result.status}"))
        line = self._line(job)
        if not self.options.keep:
            shutil.rmtree(job.folder, ignore_errors=True)
        return line

    def _line(self, job: Job, status: str | None = None, reason: str | None = None) -> dict:
        name, now = job.name, time.monotonic()
        # queued: from its submission to its first stage; judging: from there to this line
        began = job.began if job.began is not None else now
        job.seconds.update(queued=began - job.started, judging=now - began, total=now - job.started)
        key = job.key or result_key(name, job.content, self.options)
        return lines.assemble(workdir=name, key=key, content=job.content, id=job.id,
                              results=job.results, seconds=job.seconds, copy=str(job.copy), status=status,
                              reason=reason)
