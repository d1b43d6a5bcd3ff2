"""Run a workdir's build: ninja in the keyed build folder under a lock shared by parallel processes, then import the module."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pytest_cudaopt.extension import objcache
from pytest_cudaopt.extension.buildfile import MODULE_NAME, Config, configure, ninja_file, object_name, settings_or_default
from pytest_cudaopt.extension.diagnostics import MAX_REPORTED_ERRORS, BuildError, diagnostics
from pytest_cudaopt.candidate.load import import_extension
from pytest_cudaopt.run.zygote import die_with_parent

LOCK_TIMEOUT_S = 3600.0
_STATUS = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")


@dataclass
class BuildResult:
    """What one build did. `compiled`: the sources ninja compiled (workdir-relative)."""

    workdir: Path
    build_dir: Path
    so_path: Path
    seconds: float
    compiled: list[str]
    objects: int
    cached: int   # of `compiled`, the objects the object cache gave back
    linked: bool
    waited_s: float
    cuda: bool
    arch: str
    log_path: Path
    module: Any = field(default=None, repr=False)

    @property
    def up_to_date(self) -> bool:
        return not self.compiled and not self.linked


def describe(result: BuildResult) -> str:
    """The last line of `cudaopt build`."""
    if result.up_to_date:
        return f"{MODULE_NAME} up to date ({result.seconds:.1f} s): {result.so_path}"
    cached = f", {result.cached} taken from the object cache" if result.cached else ""
    return (f"built {MODULE_NAME} in {result.seconds:.1f} s ({len(result.compiled) - result.cached} of "
            f"{result.objects} objects compiled{cached}): {result.so_path}")


def _ninja() -> str:
    with contextlib.suppress(ImportError):
        import ninja  # the wheel's binary matches the declared dependency

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("ninja")
    if found is None:
        raise BuildError("cudaopt build: ninja not found (pip install ninja)")
    return found


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def failure_of(cfg: Config, output: str, log_path: Path) -> BuildError:
    """The BuildError of a failed ninja run: the diagnostics and a one-line summary."""
    sources = {object_name(s): s.as_posix() for s in cfg.sources}
    shown, per_source = diagnostics(output, cfg.workdir, cfg.build_dir, sources)
    if per_source:
        total = sum(per_source.values())
        where = ", ".join(per_source)
        many = max(per_source.values()) > MAX_REPORTED_ERRORS
        more = f" (first {MAX_REPORTED_ERRORS} per file shown)" if many else ""
        summary = f"cudaopt build: {total} error{'s' if total != 1 else ''} in {where}{more}; build log: {log_path}"
    elif shown:
        summary = f"cudaopt build: linking {MODULE_NAME} failed; build log: {log_path}"
    else:
        # Neither compiler nor linker said why: show the end of what ninja printed.
        shown = [ln for ln in output.splitlines() if ln.strip()][-15:]
        summary = f"cudaopt build: failed; build log: {log_path}"
    return BuildError(summary, shown, log_path)


class _Progress:
    """ninja's output as progress lines. ninja prints a step when it finishes, failed or not, and goes on after a
    failure: a step is shown once the next line says whether it failed, a failed unit's first errors at once."""

    SHOWN = 6       # diagnostic lines of a failed unit shown at once (all of them end the build's report)
    QUIET_S = 0.2   # ninja prints a unit's status and output together: this long quiet ends them

    def __init__(self, cfg: Config, emit: Callable[[str], None], start: float):
        self.cfg, self.emit, self.start = cfg, emit, start
        self.pending: str | None = None        # a finished step whose outcome is not known yet
        self.failed: list[str] | None = None   # the output of the failed unit being read

    def line(self, line: str) -> str | None:
        """Take one line of ninja's output; return the step's description if it is a status line."""
        match = _STATUS.match(line)
        if match:
            self.flush()
            self.pending = f"{line}  ({time.monotonic() - self.start:.1f} s)"
            return match.group(3)
        if line.startswith("FAILED: "):
            self.flush(failed=True)
            self.failed = [line]
        elif self.failed is not None:
            self.failed.append(line)
        return None

    def flush(self, failed: bool = False) -> None:
        if self.pending is not None:
            self.emit(f"{self.pending}  FAILED" if failed else self.pending)
            self.pending = None
        if self.failed is not None:
            sources = {object_name(s): s.as_posix() for s in self.cfg.sources}
            shown, per_source = diagnostics("\n".join(self.failed), self.cfg.workdir, self.cfg.build_dir, sources)
            self.failed = None
            where = ", ".join(per_source) or "a build step"
            errors = [s for s in shown if not s.startswith(" ")][:self.SHOWN]
            self.emit(f"{where} failed: " + ("; ".join(errors) if errors else "see the report when the build ends"))


def unwritable(cfg: Config, exc: OSError) -> BuildError:
    """The build folder cannot be written (a read-only workdir): one line that names the setting to build elsewhere."""
    what = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    return BuildError(f"cudaopt build: the build folder {cfg.build_dir} cannot be written ({what}); a read-only "
                      f"workdir builds elsewhere with cudaopt_build_dir (--cudaopt-build-dir=/tmp/cudaopt-build, "
                      f"CUDAOPT_BUILD_DIR or ini cudaopt_build_dir)", [], None)


def run_ninja(cfg: Config, emit: Callable[[str], None], start: float) -> tuple[list[str], int]:
    """Run ninja in the build folder; the step descriptions it reported and its exit code. A thread reads its
    output, so that a failed unit's errors show once ninja is quiet rather than when its next unit ends."""
    import queue
    import threading

    cmd = [_ninja(), "-C", str(cfg.build_dir)]
    jobs = os.environ.get("MAX_JOBS")
    if jobs and jobs.isdigit():
        cmd += ["-j", jobs]
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    steps: list[str] = []
    log_lines: list[str] = []
    progress = _Progress(cfg, emit, start)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env, preexec_fn=die_with_parent)
    assert proc.stdout is not None
    try:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)], daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=_Progress.QUIET_S)
            except queue.Empty:
                progress.flush()  # ninja is quiet: what it printed last is complete
                continue
            if line is None:
                break
            line = line.rstrip("\n")
            log_lines.append(line)
            step = progress.line(line)
            if step is not None:
                steps.append(step)
        code = proc.wait()
    except BaseException:  # a timeout or an interrupt of this process alone: ninja stops too
        _stop(proc)
        raise
    progress.flush()
    # A no-op build ("ninja: no work to do") keeps the log of the last build that did work.
    log = cfg.build_dir / "build.log"
    if steps or code != 0 or not log.is_file():
        log.write_text("\n".join(log_lines) + "\n")
    return steps, code


def _stop(proc: subprocess.Popen) -> None:
    """End ninja (SIGTERM, on which it stops its compilers), before the lock is released."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _announce(cfg: Config, emit: Callable[[str], None]) -> None:
    """What is about to compile (ninja prints a step only when it finishes)."""
    out = subprocess.run([_ninja(), "-C", str(cfg.build_dir), "-n"], capture_output=True,
                         text=True, errors="replace", env=dict(os.environ, NINJA_STATUS="[%f/%t] "))
    planned = [m.group(3) for m in map(_STATUS.match, out.stdout.splitlines()) if m]
    compiles = [p.split(" ", 1)[1] for p in planned if p.startswith(("c++ ", "nvcc "))]
    if compiles:
        emit(f"compiling {len(compiles)} of {len(cfg.sources)} sources for {cfg.arch}: {', '.join(compiles)}")


def compile_extension(workdir: Path, *, settings=None, verbose: bool = False,
                      emit: Callable[[str], None] | None = None) -> BuildResult:
    """Bring the workdir's build up to date (without importing it). Parallel callers on the same workdir build
    once: one holds the lock, the others wait, then find it up to date."""
    from filelock import FileLock, Timeout

    announce = verbose or emit is not None
    if emit is None:
        emit = (lambda text: print(text, flush=True)) if verbose else (lambda text: None)
    start = time.monotonic()
    workdir = Path(workdir).resolve()
    cfg = configure(workdir, settings_or_default(settings, workdir))
    lock = FileLock(str(cfg.build_dir / "lock"))
    waited = 0.0
    try:
        cfg.build_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:  # first: filelock's Timeout is a TimeoutError, hence an OSError
        emit(f"waiting for another build of {workdir} (lock {cfg.build_dir / 'lock'})")
        t = time.monotonic()
        try:
            lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout:
            raise BuildError(f"cudaopt build: gave up after {LOCK_TIMEOUT_S:.0f} s waiting for the "
                             f"lock {cfg.build_dir / 'lock'}") from None
        waited = time.monotonic() - t
    except OSError as exc:
        raise unwritable(cfg, exc) from None
    try:
        try:
            _write_if_changed(cfg.build_dir / "build.ninja", ninja_file(cfg))
            _write_if_changed(cfg.build_dir / "config.json",
                              json.dumps(cfg.key_parts, indent=2, sort_keys=True, default=str) + "\n")
        except OSError as exc:
            raise unwritable(cfg, exc) from None
        if announce:
            _announce(cfg, emit)
        hits = objcache.counts(cfg.build_dir)["hit"]   # the log is the build folder's, over every build
        steps, code = run_ninja(cfg, emit, start)
        hits = objcache.counts(cfg.build_dir)["hit"] - hits
        log_path = cfg.build_dir / "build.log"
        if code != 0:
            raise failure_of(cfg, log_path.read_text(errors="replace"), log_path)
    finally:
        lock.release()
    compiled = [s.split(" ", 1)[1] for s in steps if s.startswith(("c++ ", "nvcc "))]
    return BuildResult(workdir=workdir, build_dir=cfg.build_dir, so_path=cfg.build_dir / f"{MODULE_NAME}.so",
                       seconds=time.monotonic() - start, compiled=compiled, objects=len(cfg.sources), cached=hits,
                       linked=any(s.startswith("link ") for s in steps), waited_s=waited, cuda=cfg.cuda, arch=cfg.arch,
                       log_path=log_path)


def existing_build(workdir: Path, *, settings=None) -> Path | None:
    """The .so of the workdir's last build for the current configuration, or None; compiles and imports nothing."""
    workdir = Path(workdir).resolve()
    try:
        cfg = configure(workdir, settings_or_default(settings, workdir))
    except (BuildError, ValueError):  # ValueError: a setting of the workdir's ini that does not parse
        return None
    so = cfg.build_dir / f"{MODULE_NAME}.so"
    return so if so.is_file() else None


def _demangle(text: str) -> str:
    names = re.findall(r"_Z\w+", text)
    if not names or not shutil.which("c++filt"):
        return text
    try:
        out = subprocess.run(["c++filt", *names], capture_output=True, text=True).stdout.split("\n")
    except OSError:  # in the worker's sandbox no program starts: the names stay mangled
        return text
    for raw, nice in zip(names, out):
        text = text.replace(raw, f"{nice} ({raw})" if nice and nice != raw else raw)
    return text


def build(workdir: Path, *, settings=None, verbose: bool = False,
          emit: Callable[[str], None] | None = None) -> BuildResult:
    """Build and import; the result's `module` is the loaded extension, under a name unique to this build (a fresh
    copy of a rebuilt .so). `emit` receives the progress lines; a module that does not import is a BuildError."""
    result = compile_extension(workdir, settings=settings, verbose=verbose, emit=emit)
    try:
        result.module = import_extension(result.so_path, result.build_dir)
    except ImportError as exc:
        raise BuildError(f"cudaopt build: {MODULE_NAME} of {result.workdir} was built but does "
                         f"not import: {_demangle(str(exc))}", [], result.log_path) from None
    return result


def build_extension(workdir: Path, *, settings=None, verbose: bool = False, emit: Callable[[str], None] | None = None):
    """The workdir's loaded `cuda_extension` module, rebuilt only where its tree changed."""
    return build(workdir, settings=settings, verbose=verbose, emit=emit).module
