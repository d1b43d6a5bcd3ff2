"""The judge's front: paths to workdirs, the local pool or Ray, lines written as they come (with --resume, kept ones skipped), and the exit code."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from pytest_cudaopt.judge import copies, lines as line_module
from pytest_cudaopt.judge.discover import find_workdirs
from pytest_cudaopt.judge.options import Options, result_key

# Exit codes of `cudaopt judge` (2, bad arguments, is argparse's); 75 and 70 (blame.py) where a
# workdir's line blames the environment (after its retries) or the harness, and none is unjudged.
PASSED, FAILED, UNJUDGED = 0, 1, 3


class Judge:
    """Iterate for one line per workdir found under `paths`, as each finishes; afterwards `busy` and `wall_s`.
    `ray`: an address for the Ray backend; `skip`: keys whose lines are already had (resume)."""

    def __init__(self, paths: Sequence[str | Path], options: Options | None = None, *, ray: str | None = None,
                 on_event: Callable[..., None] | None = None, skip: frozenset[str] = frozenset()):
        self.options = options or Options()
        self.workdirs, self.problems = find_workdirs(paths)
        recorded = {_recorded_device(w) for w in self.workdirs}
        if len(recorded) == 1:  # each child reads its own; the devices to schedule on follow them
            self.options = replace(self.options, recorded_device=recorded.pop())
        self.ray, self.on_event, self.skip = ray, on_event, skip
        self.busy: dict[str, float] = {}
        self.wall_s = 0.0
        self._backend = None

    def __len__(self) -> int:
        return len(self.workdirs) + len(self.problems)

    def __iter__(self) -> Iterator[dict]:
        # each line's id: its workdir's place among those found (0, 1, ...), then the paths that named none
        order = {str(w): n for n, w in enumerate(self.workdirs)}
        for n, (raw, why) in enumerate(self.problems):
            yield line_module.unjudged(raw, result_key(raw, "", self.options), "error", why, id=len(order) + n)
        todo = [w for w in self.workdirs if not self.skip or self.keys[str(w)] not in self.skip]
        named: set[str] = set()
        try:
            for line in self._lines(todo):
                line.setdefault("attempts", 1)
                named.add(line["workdir"])
                line["id"] = order.get(line["workdir"], line.get("id"))
                yield line
        except Exception as exc:  # noqa: BLE001 - the judge's own failure: each workdir left still gets its line
            why = f"not judged: the judge failed before this workdir was judged: {type(exc).__name__}: {exc}"
            for workdir in todo:
                if str(workdir) not in named:
                    yield line_module.unjudged(str(workdir), result_key(str(workdir), "", self.options), "error", why,
                                               id=order[str(workdir)])

    @functools.cached_property
    def keys(self) -> dict[str, str | None]:
        """Each workdir's result key now (its files digested once), by its path."""
        return {str(w): _key(w, self.options) for w in self.workdirs}

    def _lines(self, todo: list[Path]) -> Iterator[dict]:
        """One line per workdir of `todo`; the busy fractions and wall time add up. A line that blames the
        environment is judged again at once, ahead of the workdirs still queued (in the same local pool, as a Service
        does, or by the Ray driver), and only the last attempt's line comes out (lines.Attempts)."""
        if self.ray:
            from pytest_cudaopt.judge.ray_backend import RayPool

            backend = RayPool(todo, self.options, self.ray)
            lines = backend.lines()
        else:
            from pytest_cudaopt.judge.pool import LocalPool

            backend = LocalPool(todo, self.options, on_event=self.on_event)
            backend.fed = bool(backend.devices.names)   # else each workdir's line says at once there is no device
            lines = self._with_retries(backend, len(todo)) if backend.fed else backend.lines()
        self._backend = backend
        try:
            yield from lines
        finally:
            self.wall_s += backend.wall_s
            for device, busy in backend.busy.items():
                self.busy[device] = busy if device not in self.busy else max(self.busy[device], busy)

    def stop(self, why: str) -> None:
        """Every child ended; the lines still to come (iterate on) are a `cancelled` one for each workdir left. For
        an interrupt raised outside the iteration (while a line is written): one raised in it does this itself."""
        if self._backend is not None:
            self._backend.stop(why)

    def _with_retries(self, pool, count: int) -> Iterator[dict]:
        """The lines of a fed `pool` holding `count` workdirs; one that blames the environment goes back into it
        (`attempts` counted here, the last attempt's line yielded), and the pool closes after the last line."""
        attempts = line_module.Attempts(self.options.judge_again)
        if not count:
            pool.close()
        for line in pool.lines():
            if attempts.again(line["workdir"], line):
                pool.add(Path(line["workdir"]), again=True)
                continue
            count -= 1
            if not count:
                pool.close()
            yield line


def _recorded_device(workdir: Path) -> str | None:
    """The device a workdir's settings name (`cudaopt init --device cpu` records it), None if unreadable."""
    from pytest_cudaopt.suite.settings import SettingError, workdir_settings

    try:
        return workdir_settings(workdir).device
    except (SettingError, OSError, ValueError):
        return None


def _key(workdir: Path, options: Options) -> str | None:
    try:
        return result_key(str(workdir), copies.digest(copies.workdir_files(workdir)), options)
    except (OSError, copies.CopyError):
        return None


def _kept(found: list[dict], job: Judge) -> list[dict]:
    """The lines `--resume` keeps: each that judged its workdir (not `error` or `cancelled`), unless this run names
    that workdir and would give it another key (its files changed, or the options or the judge that decide it)."""
    return [line for line in found if line.get("status") not in ("error", "cancelled")
            and job.keys.get(line.get("workdir"), line.get("key")) == line.get("key")]


def judge(paths: Sequence[str | Path], options: Options | None = None, **kwargs) -> Iterator[dict]:
    """One line per workdir under `paths` (workdirs, or folders holding them), each as it finishes."""
    return iter(Judge(paths, options, **kwargs))


@dataclass
class Written:
    """What `run` wrote: every line (kept from an earlier run first), its exit code, the run's stats."""

    lines: list[dict] = field(default_factory=list)
    code: int = PASSED
    wall_s: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)
    kept: int = 0


def exit_code(found: Sequence[dict]) -> int:
    from pytest_cudaopt.results import blame

    code = blame.exit_status(blame.worst(line.get("blame") for line in found if line.get("blame") != blame.CANDIDATE))
    if code:
        return code
    if any(line["status"] in ("error", "cancelled") for line in found):
        return UNJUDGED
    return PASSED if all(line["passed"] for line in found) else FAILED


def run(paths: Sequence[str | Path], options: Options, *, out: Path, ray: str | None = None, resume: bool = False,
        progress=None) -> Written:
    """Judge and write each line to `out` (JSON lines) as it comes. `resume`: the lines of `out` that judged a
    workdir are kept, and those workdirs, unchanged, skipped."""
    job = Judge(paths, options, ray=ray, on_event=progress.event if progress is not None else None)
    kept = _kept(line_module.read_lines(out), job) if resume else []
    job.skip = frozenset(line["key"] for line in kept)
    if progress is not None:
        progress.total = len(job)
    written = Written(lines=list(kept), kept=len(kept))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for line in kept:
            handle.write(line_module.dumps(line) + "\n")

        def write(line: dict) -> None:
            handle.write(line_module.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            written.lines.append(line)
            if progress is not None:
                progress.line(line)

        lines, writing = iter(job), None
        try:
            for writing in lines:
                write(writing)
                writing = None
        except KeyboardInterrupt:
            # Raised in the judging, the pool ended its children and gave each workdir left its `cancelled` line (the
            # iteration is over); raised here, while a line was written, the pool is stopped now and gives them.
            job.stop("the judge was interrupted")
            if writing is not None and not (written.lines and written.lines[-1] is writing):
                write(writing)   # cut short before it was in the file
            for line in lines:
                write(line)
            raise
        finally:
            if progress is not None:
                progress.close()
    written.code, written.wall_s, written.busy = exit_code(written.lines), job.wall_s, job.busy
    return written
