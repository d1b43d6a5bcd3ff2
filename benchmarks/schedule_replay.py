"""Replay a judge run's stage times through the judge's own scheduler on a virtual clock: the wall time it
predicts for other settings (`--share`, turn batching), from one GPU run's lines, without a GPU.

    python benchmarks/schedule_replay.py judge.jsonl [--share 4 8] [--ahead 0 4] [--batch-wait 0 3 6] [--jobs 8]
                                         [--scale check=0.5]

Each workdir's stages take what they took in the run: a check or perf stage its start-up before it asked for
its place (`--ahead`: without one), then a check its time in its place, a perf stage its time before its turn,
then its turn, then its exit after it left its place (`*_exit`); the waits are the scheduler's to decide. An attempt
judged again (`*_again`, `*_again_alone`) holds its place for its seconds, then goes back to the scheduler as the
judge's did; a workdir judged again whole (its line's `earlier`, with their seconds) runs each earlier attempt's
stages, then goes again ahead of the queue. CPU contention is not modelled: builds keep their measured time.
With the run's own settings, the replay's wall against the run's (`--measured`) is the replay's error.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from pytest_cudaopt.judge.scheduler import STAGES, Scheduler, Task


@dataclass
class Work:
    stages: list[str]                 # the stages it ran, in order
    seconds: dict[str, float]         # build, policy, check_before, check, check_exit, perf_before, perf_prepare,
    #                                   perf_turn, perf_exit
    # per stage, its attempts judged again: (their seconds, then alone?), in the judge's order (placed, then alone)
    again: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    # the workdir's attempts judged again whole before this one (its line's `earlier` with their seconds), in order
    earlier: list["Work"] = field(default_factory=list)


def _work(stages: list[str], seconds: dict[str, float]) -> Work:
    """One attempt at a workdir: the stages it ran and its line's (or `earlier` entry's) seconds."""
    perf = seconds.get("perf", 0.0)
    before = {s: seconds.get(f"{s}_before_place", 0.0) for s in ("check", "perf")}   # 0: an older run's line
    waited = {s: seconds.get(f"{s}_place_wait", 0.0) for s in ("check", "perf")}
    exits = {s: seconds.get(f"{s}_exit", 0.0) for s in ("check", "perf")}   # 0: the place held to the end
    paused = {s: seconds.get(f"{s}_paused", 0.0) for s in ("check", "perf")}  # the replay pauses them itself
    again = {s: [(seconds[k], alone) for k, alone in ((f"{s}_again", False), (f"{s}_again_alone", True))
                 if seconds.get(k)] for s in ("check", "perf")}
    spent = {s: sum(t for t, _ in again[s]) for s in again}   # in the stage's seconds, beside the last attempt
    return Work(stages, {"build": seconds.get("build", 0.0), "policy": seconds.get("policy", 0.0),
                         "check_before": before["check"],
                         "check": max(0.0, seconds.get("check", 0.0) - spent["check"] - before["check"]
                                      - waited["check"] - exits["check"] - paused["check"]),
                         "check_exit": exits["check"],
                         "perf_before": before["perf"],
                         "perf_prepare": max(0.0, perf - spent["perf"] - seconds.get("perf_wait", 0.0)
                                             - before["perf"] - waited["perf"] - seconds.get("perf_turn", 0.0)
                                             - exits["perf"] - paused["perf"]),
                         "perf_turn": seconds.get("perf_turn", 0.0), "perf_exit": exits["perf"]},
                {s: a for s, a in again.items() if a})


def load(path: Path) -> list[Work]:
    """The workdirs of a judge's JSON lines (the file judge_gallery.py or `cudaopt judge --out` writes)."""
    works = []
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        work = _work([s for s in STAGES if s in line["stages"] and line["stages"][s].get("status") != "not-run"],
                     line["seconds"])
        # an earlier attempt ran the stages its seconds name (an older run's `earlier` has none: not replayed)
        work.earlier = [_work([s for s in STAGES if s in e["seconds"]], e["seconds"])
                        for e in line.get("earlier", []) if e.get("seconds")]
        works.append(work)
    return works


def replay(works: list[Work], share: int, jobs: int, batch_wait: float = 0.0, ahead: int = 0,
           pause: float | None = None) -> dict:
    """The wall time the scheduler gives `works` on one GPU. `batch_wait`: a perf stage's ask is passed on once
    every perf stage on the GPU has asked or the first ask is `batch_wait` seconds old (turns taken together).
    `pause`: a turn pauses the checks placed beside it, each `pause` seconds (its item's end) after the ask,
    instead of waiting for them to end (None: it waits)."""
    now = [0.0]
    scheduler = Scheduler(["0"], jobs=jobs, share=share, turns=True, ahead=ahead, pause=pause is not None,
                          clock=lambda: now[0])
    ends: dict[int, tuple[float, int]] = {}   # a placed check's job -> (its end, the order of its end event)
    frozen: dict[int, float] = {}             # a paused check's job -> the seconds of work it has left
    running: dict[int, Task] = {}
    # each attempt a job of its own (a workdir judged again whole: its earlier attempts first, then its line's);
    # `attempts` indexes them by job, `follows` names the attempt added once a job's last stage ends
    attempts: list[Work] = []
    follows: dict[int, tuple[int, list[Work]]] = {}
    for index, work in enumerate(works):
        chain = [*work.earlier, work]
        attempts.append(chain[0])
        if len(chain) > 1:
            follows[index] = (index, chain[1:])
        scheduler.add(index, f"p{index}", stages=chain[0].stages)

    def ended(job: int, stage: str) -> None:   # the attempt's last stage ended: the workdir goes again, ahead
        if stage != attempts[job].stages[-1] or job not in follows:
            return
        workdir, rest = follows.pop(job)
        attempts.append(rest[0])
        if len(rest) > 1:
            follows[len(attempts) - 1] = (workdir, rest[1:])
        scheduler.add(len(attempts) - 1, f"p{workdir}", stages=rest[0].stages, first=True)
    events: list[tuple[float, int, str, Task]] = []
    order = itertools.count()   # ties in time keep the order they were pushed in
    asked: list[tuple[float, Task]] = []     # asks held back for a batch
    running_perf: set[int] = set()
    turns, waited = 0, 0.0
    want_at: dict[int, float] = {}
    tried: dict[tuple[int, str], int] = {}   # a stage's attempts judged again so far
    starting: set[int] = set()               # asked to pause before its time in its place began

    def again(task: Task) -> tuple[float, bool] | None:   # the attempt now running is judged again: its seconds
        tries = attempts[task.job].again.get(task.stage, [])
        done = tried.get((task.job, task.stage), 0)
        return tries[done] if done < len(tries) else None

    def ending(task: Task) -> str:   # what ends its time in its place
        return "again" if again(task) else "want" if task.stage == "perf" else "leave"

    def push(at: float, what: str, task: Task) -> int:
        heapq.heappush(events, (at, number := next(order), what, task))
        return number

    def pass_asks(force: bool) -> None:
        nonlocal asked
        if asked and (force or len(asked) == len(running_perf) or now[0] - asked[0][0] >= batch_wait):
            for _, task in asked:
                scheduler.want(task)
            asked = []

    while not scheduler.done:
        for task in scheduler.ready():
            if task.device is not None:   # starts up, then asks for its place
                running[task.job] = task
                push(now[0] + attempts[task.job].seconds[f"{task.stage}_before"], "enter", task)
            else:
                push(now[0] + attempts[task.job].seconds[task.stage], "end", task)
        for job in scheduler.admits():
            task = running[job]
            if (attempt := again(task)) is not None:   # it holds its place for what it took, less its start-up
                at = now[0] + max(0.0, attempt[0] - attempts[task.job].seconds[f"{task.stage}_before"])
                ends[task.job] = (at, push(at, "again", task))
            elif task.stage == "perf":   # it prepares (paused for turns as a check is), then asks for its turn
                running_perf.add(task.job)
                at = now[0] + attempts[task.job].seconds["perf_prepare"]
                ends[task.job] = (at, push(at, "want", task))
            else:
                at = now[0] + attempts[task.job].seconds[task.stage]
                ends[task.job] = (at, push(at, "leave", task))
            if job in starting:   # asked to pause while it started up in a place held from its start: at its first item
                starting.discard(job)
                frozen[job] = ends[job][0] - now[0]
                ends[job] = (ends[job][0], -1)
                push(now[0], "paused", task)
        for job in scheduler.pauses():   # it pauses at its item's end, or ends first
            if job not in ends:
                starting.add(job)
                continue
            at, _ = ends[job]
            if at - now[0] > pause:
                frozen[job] = at - now[0] - pause
                ends[job] = (at, -1)   # its end event is void until it resumes
                push(now[0] + pause, "paused", running[job])
        for job in scheduler.resumes():
            starting.discard(job)
            if job in frozen:
                at = now[0] + frozen.pop(job)
                ends[job] = (at, push(at, ending(running[job]), running[job]))
        for job in scheduler.grants():
            turns += 1
            waited += now[0] - want_at[job]
            push(now[0] + attempts[job].seconds["perf_turn"], "leave", Task(job, "perf", "0"))
        if not events:
            if asked:
                pass_asks(True)
                continue
            raise RuntimeError("the replay stalled: nothing runs and nothing is due")
        due = events[0][0]
        if asked and batch_wait > 0:   # an ask held back comes due at its batch's deadline
            due = min(due, asked[0][0] + batch_wait)
        now[0] = max(now[0], due)
        while events and events[0][0] <= now[0]:
            _, number, what, task = heapq.heappop(events)
            if ((what == "leave" and task.stage == "check") or what in ("want", "again")) and \
                    ends.get(task.job, (0, number))[1] != number:
                continue   # voided by a pause
            if what in ("leave", "again", "end"):
                ends.pop(task.job, None)   # its time in its place is over
            if what == "leave":   # its place (and turn) end; its exit goes on without one
                scheduler.leave(task)
                push(now[0] + attempts[task.job].seconds[f"{task.stage}_exit"], "end", task)
            elif what == "paused":
                if task.job in frozen:
                    scheduler.paused(task)
            elif what == "again":   # the judge places it again as any, or alone
                alone = again(task)[1]
                tried[task.job, task.stage] = tried.get((task.job, task.stage), 0) + 1
                scheduler.finish(task, retry=not alone, retry_alone=alone)
            elif what == "enter":
                scheduler.enter(task)
            elif what == "want":
                want_at[task.job] = now[0]
                asked.append((now[0], task))
            else:
                if task.stage == "perf":
                    running_perf.discard(task.job)
                scheduler.finish(task, proceed=True, complete=task.stage == "check")
                ended(task.job, task.stage)
        pass_asks(batch_wait <= 0)
    return {"wall_s": now[0], "per_hour": len(works) / now[0] * 3600, "turns": turns, "waited_s": waited,
            "busy": scheduler.busy_fraction()["0"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines", type=Path, help="a judge run's JSON lines")
    parser.add_argument("--share", type=int, nargs="+", default=[4])
    parser.add_argument("--ahead", type=int, nargs="+", default=[0],
                        help="check and perf stages per GPU that start up before a place is free (the judge's --ahead)")
    parser.add_argument("--batch-wait", type=float, nargs="+", default=[0.0],
                        help="seconds a perf stage's ask may wait for others before the GPU drains")
    parser.add_argument("--pause", type=float, nargs="+", default=[-1.0],
                        help="seconds from a pause's ask to a check's item's end (turns pause checks); -1: turns "
                             "wait for checks to end")
    parser.add_argument("--jobs", type=int, default=8, help="builds and policy checks at once (the run's)")
    parser.add_argument("--measured", type=float, default=None, help="the run's wall seconds, for the first row")
    parser.add_argument("--scale", nargs="+", default=[], metavar="PART=FACTOR",
                        help="each workdir's time in PART (build, policy, check_before, check, perf_before, "
                             "perf_prepare, perf_turn) times FACTOR")
    args = parser.parse_args()
    works = load(args.lines)
    for part, factor in (item.split("=") for item in args.scale):
        for work in (attempt for work in works for attempt in (*work.earlier, work)):
            work.seconds[part] *= float(factor)
    print(f"{len(works)} workdirs from {args.lines}")
    print(f"{'share':>5}  {'ahead':>5}  {'pause s':>7}  {'batch wait s':>12}  {'wall s':>7}  {'per hour':>8}  {'turns':>5}  "
          f"{'waited s':>8}  busy")
    for share in args.share:
        for ahead in args.ahead:
            for wait, pause in itertools.product(args.batch_wait, args.pause):
                got = replay(works, share, args.jobs, wait, ahead, None if pause < 0 else pause)
                print(f"{share:>5}  {ahead:>5}  {pause:>7.1f}  {wait:>12.1f}  {got['wall_s']:>7.1f}  {got['per_hour']:>8.0f}  "
                      f"{got['turns']:>5}  {got['waited_s']:>8.1f}  {got['busy']:.0%}")
    if args.measured:
        print(f"measured: {args.measured:.1f} s, {len(works) / args.measured * 3600:.0f} an hour")


if __name__ == "__main__":
    main()
