"""The memory-safety verdict: one small case of the candidate in child processes under compute-sanitizer (memcheck, racecheck and initcheck at once), the caching allocator off.

Only the workdir's own kernels are judged (a report whose source line is in the workdir); anything else is a note."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pytest_cudaopt.memsafety import log as sanitizer_log
from pytest_cudaopt.correctness import shapes
from pytest_cudaopt.results.records import MemorySafetyResult
from pytest_cudaopt.run.scratch import own_folder

EXECUTABLE = "compute-sanitizer"
ERROR_EXIT = 86  # --error-exitcode: the sanitizer found errors (the child's own failures are 1-3)
# memcheck is the item's tool; the others run beside it, and one still running at the time limit is a note.
TOOLS: dict[str, tuple[str, ...]] = {"memcheck": ("--tool", "memcheck", "--padding", "32", "--leak-check", "no"),
                                     "racecheck": ("--tool", "racecheck"), "initcheck": ("--tool", "initcheck")}
REQUIRED = "memcheck"
WATCHDOG_MARGIN_S = 30.0  # the children end this long before the item's cudaopt_timeout
POLL_S = 0.05  # how often the item, waiting on its children, looks for a pause asked (a turn's wait at most)
PRINT_LIMIT = 50


def find_sanitizer(setting: str | None = None) -> tuple[str | None, str]:
    """(path of compute-sanitizer or None, where it was looked for): the setting, else PATH, else the toolkit's bin/."""
    if setting:
        path = Path(setting).expanduser()
        usable = path.is_file() and os.access(path, os.X_OK)
        return (str(path) if usable else None), f"cudaopt_compute_sanitizer={setting}"
    found = shutil.which(EXECUTABLE)
    if found:
        return found, "PATH"
    from pytest_cudaopt.extension import find_cuda_home

    try:
        home = find_cuda_home()
    except Exception:  # noqa: BLE001 - no toolkit: nothing more to look at
        home = None
    candidate = Path(home) / "bin" / EXECUTABLE if home else None
    if candidate is not None and candidate.is_file():
        return str(candidate), str(candidate.parent)
    return None, "PATH" + (f" and {candidate.parent}" if candidate is not None else "")


def sanitizes(settings: Any) -> bool:
    """Whether the item runs the tools here: on CUDA, or in the plugin's own CPU tests with a stand-in sanitizer."""
    return settings.device == "cuda" or bool(settings.self_test and settings.compute_sanitizer)


def time_limit(settings: Any) -> float:
    """The seconds all the children have together: cudaopt_memsafety_timeout, within the item's cudaopt_timeout."""
    return max(10.0, min(settings.memsafety_timeout, settings.timeout - WATCHDOG_MARGIN_S))


def small_case(reference: Any, settings: Any) -> dict[str, int]:
    """The case the sanitizer runs: `cudaopt_memsafety_case` when set, else the valid case with the fewest
    input elements among the canonical one and the explicit cases (which the correctness items judge too)."""
    if settings.memsafety_case:
        return shapes.parse_case(settings.memsafety_case)
    space = shapes.shape_space(reference, settings.max_elements)
    best: tuple[int, dict[str, int]] | None = None
    for case in [{}, *shapes.explicit_cases(reference, space).cases]:
        check = shapes.check_on_meta(reference, case)
        if check.valid and (best is None or check.elements < best[0]):
            best = (check.elements, {k: v for k, v in case.items() if space.defaults.get(k) != v})
    return best[1] if best is not None else {}


def child_command(workdir: Path, extension: str, scratch: str, device: str, sandbox: str = "off",
                  sanitizer: tuple[str, str, Path] | None = None, wait: float = 0.0) -> list[str]:
    """The child's command line (candidate/sanitized.py, its case in `scratch`, waited for up to `wait` seconds);
    with `sanitizer` (executable, tool, log file), run under it."""
    under = [sanitizer[0], *TOOLS[sanitizer[1]], "--print-limit", str(PRINT_LIMIT), "--error-exitcode",
             str(ERROR_EXIT), "--log-file", str(sanitizer[2])] if sanitizer else []
    return [*under, sys.executable, "-m", "pytest_cudaopt.candidate.sanitized", str(workdir), "--extension", extension,
            "--scratch", scratch, "--device", device, *(["--sandbox", sandbox] if sandbox != "off" else []),
            *(["--wait", f"{wait:g}"] if wait else [])]


def child_environment() -> dict[str, str]:
    """The caching allocator off (a pooled block hides a write past a tensor's end), this package importable, and
    no bytecode written: the candidate's code runs there."""
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONDONTWRITEBYTECODE="1")
    paths = [str(Path(__file__).resolve().parents[2]), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


@dataclass
class Run:
    """One tool's child: exit status (None: stopped at its time limit), its log, its output."""

    tool: str
    returncode: int | None
    log: str
    output: str
    seconds: float
    states: str = ""   # stopped at its time limit: its processes' states then (`name state`, /proc's letters)


def _group_states(pgid: int) -> str:
    """`name state` of each process in group `pgid` (R running, S sleeping, D in the kernel, T stopped)."""
    from pytest_cudaopt.run.signals import process_stat

    found = [process_stat(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return ", ".join(f"{name} {state}" for name, state, group in filter(None, found) if group == pgid)


class Child:
    """One tool's sanitized child, started in a process group of its own."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str], cwd: Path, tool: str) -> None:
        from pytest_cudaopt.run.zygote import die_with_parent

        self.tool, self.log, self.started = tool, log, time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, preexec_fn=die_with_parent)
        self.output: list[str] = []
        # Drained on a thread, so a chatty child never blocks on a full pipe while another is waited on.
        self.reader = threading.Thread(target=lambda: self.output.append(self.proc.stdout.read()), daemon=True)
        self.reader.start()

    def finish(self, left: Callable[[], float], between: Callable[[], None] = lambda: None) -> Run:
        """Its Run once it exits, or once `left()` seconds are none, its group killed (returncode None). `between`
        runs every POLL_S while it waits (a pause point: a turn on the device stops the children meanwhile, and
        `left()` grows by the pause)."""
        code: int | None = None
        states = ""
        while True:
            try:
                code = self.proc.wait(timeout=max(0.0, min(POLL_S, left())))
                break
            except subprocess.TimeoutExpired:
                if left() <= 0:
                    states = _group_states(self.proc.pid)
                    self.kill()
                    break
                between()
        self.reader.join()
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return Run(self.tool, code, text, "".join(self.output), time.perf_counter() - self.started, states)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Sanitized:
    """The three tools' children for one built workdir, each in a scratch folder of its own (the logs in one they
    cannot write). Started as soon as the workdir is built, before the case is drawn (its memory-safety item
    started ahead): each imports torch under its tool meanwhile, and loads nothing of the workdir's before `send`."""

    def __init__(self, workdir: Path, extension: str, device: str, sandbox: str, sanitizer: str, wait: float) -> None:
        self.key, self.sanitizer = self.key_of(workdir, extension, device, sandbox, sanitizer), sanitizer
        self.scratch = own_folder("memsafety")   # a killed owner's are removed by the next (run/scratch.py)
        self.child_scratch = own_folder("sanitized")
        self.children: dict[str, Child] = {}
        try:
            for tool in TOOLS:
                own = self.child_scratch / tool
                own.mkdir()
                env = dict(child_environment(), TMPDIR=str(own), CUDA_CACHE_PATH=str(own / "cuda-cache"))
                log = self.scratch / f"{tool}.log"
                cmd = child_command(workdir, extension, str(own), device, sandbox, (sanitizer, tool, log), wait)
                self.children[tool] = Child(cmd, log, env, workdir, tool)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def key_of(workdir: Path, extension: str, device: str, sandbox: str, sanitizer: str) -> tuple:
        return str(Path(workdir).resolve()), str(Path(extension).resolve()), device, sandbox, sanitizer

    def waiting(self) -> bool:
        """Every child is still there, waiting for its case."""
        return all(child.proc.poll() is None for child in self.children.values())

    def send(self, case: dict) -> None:
        """The case to every child at once (a complete file: each loads it as soon as it appears)."""
        import torch

        from pytest_cudaopt.candidate.sanitized import CASE

        torch.save(case, self.scratch / CASE)
        for tool, child in self.children.items():
            part = self.child_scratch / tool / f"{CASE}.part"
            shutil.copyfile(self.scratch / CASE, part)
            os.replace(part, self.child_scratch / tool / CASE)
            child.started = time.perf_counter()

    def close(self) -> None:
        for child in self.children.values():   # an error, or a session that ended first: none is left behind
            if child.proc.poll() is None:
                child.kill()
        shutil.rmtree(self.scratch, ignore_errors=True)
        shutil.rmtree(self.child_scratch, ignore_errors=True)


def _tail(text: str, lines: int = 12) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(f"    {line}" for line in kept[-lines:])


# An output this far (relative L2) from model.py's on the sanitized case was not computed by ModelNew's
# function at all (zeros: 1, noise: about 1.4); how close it must be is the correctness items' to judge.
FAR_FROM_REFERENCE = 0.5


def call_evidence(run: Run, scratch: Path, want: list) -> str | None:
    """Why a child that exited 0 does not vouch for a call of ModelNew's own kernels, or None: its word that the
    call completed, an op audit with no torch op, and an output that is model.py's (`want`) on the case."""
    import torch

    from pytest_cudaopt.candidate.sanitized import DONE, OUTPUT
    from pytest_cudaopt.correctness.precision import relative_l2_error

    said = next((line for line in reversed(run.output.splitlines()) if line.startswith(DONE)), None)
    if said is None:
        return (f"the child under {run.tool} exited 0 without word of a completed call of ModelNew (a workdir that "
                f"does not run its kernels under the sanitizer passes nothing):\n{_tail(run.output)}")
    try:
        ops = list(json.loads(said[len(DONE):]).get("audit") or [])
    except (ValueError, TypeError, AttributeError):
        return f"the child under {run.tool} wrote an unreadable word of its call: {said[:200]}"
    if ops:
        return f"under {run.tool}, ModelNew called torch ops, not its own kernels: " + "; ".join(map(str, ops[:5]))
    try:
        got = torch.load(scratch / OUTPUT, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the candidate left there
        return f"the call's output under {run.tool} could not be read back ({type(exc).__name__}: {exc})"
    if not isinstance(got, list) or len(got) != len(want):
        count = len(got) if isinstance(got, list) else "?"
        return f"the call under {run.tool} returned {count} tensor(s), model.py {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(w.shape):
            return f"output {i} under {run.tool} has shape {tuple(getattr(g, 'shape', ()))}, model.py's {tuple(w.shape)}"
        error = relative_l2_error(g, w.double())
        if error != error or error > FAR_FROM_REFERENCE:
            return (f"output {i} of the call under {run.tool} is {error:.3g} (relative L2) from model.py's on the "
                    f"same case, so the sanitizer did not see kernels that compute model.py's function (a wrong "
                    f"kernel fails here too: correctness judges its output)")
    return None


def draw_case(workdir: Any, case: dict[str, int], seed: int, device: str) -> tuple[dict, list]:
    """The sanitized case as the child gets it (model.py's init arguments, Model's state and the inputs under
    `seed`, on the CPU) and model.py's output on it (the tensors, on the CPU)."""
    import torch

    from pytest_cudaopt.candidate.observe import leaves
    from pytest_cudaopt.workdir import non_persistent_buffers

    def cpu(values: dict) -> dict:
        return {k: v.detach().cpu() for k, v in values.items()}

    with shapes.applied(workdir.reference, case):
        init, model = workdir.make_reference(device, seed)
        inputs = workdir.inputs(seed, device)
        with torch.no_grad():
            output = model(*inputs)
    state, buffers = cpu(model.state_dict()), cpu(non_persistent_buffers(model))
    want = [leaf.detach().cpu() for _, leaf in leaves(output) if isinstance(leaf, torch.Tensor)]
    sent = [x.detach().cpu() if isinstance(x, torch.Tensor) else x for x in inputs]
    return {"init": list(init), "seed": seed, "state": state, "buffers": buffers, "inputs": sent}, want


def judge_run(run: Run, workdir: Path, build_dir: Path | None, result: MemorySafetyResult,
              evidence: Callable[[Run], str | None] | None = None) -> None:
    """Fold one tool's run into `result`: findings, notes, and a failure where it vouches for nothing."""
    report = sanitizer_log.read(run.tool, run.log, workdir, build_dir)
    result.findings += [f.line() for f in report.findings]
    result.notes += report.notes
    if run.returncode is None:
        result.tools[run.tool] = f"stopped after {run.seconds:.0f} s"
        then = f" (its processes then: {run.states})" if run.states else ""
        if run.tool == REQUIRED:
            result.failures.append(f"{run.tool} did not finish within its time ({run.seconds:.0f} s); raise "
                                   f"cudaopt_memsafety_timeout or set a smaller cudaopt_memsafety_case{then}")
        else:
            result.notes.append(f"{run.tool} was stopped at the time limit after {run.seconds:.0f} s{then}")
        return
    result.tools[run.tool] = f"{len(report.findings)} finding(s)" if report.findings else "clean"
    unread = (report.summary_errors or 0) > report.records or (run.returncode == ERROR_EXIT and not report.records)
    if unread and not report.findings:
        result.failures.append(f"{run.tool} reported {report.summary_errors or 'some'} error(s) that could not be "
                               f"read as records:\n{_tail(run.log)}")
    elif run.returncode not in (0, ERROR_EXIT) and not report.findings:
        result.failures.append(f"the case did not complete under {run.tool} (exit status {run.returncode}):\n"
                               f"{_tail(run.output)}")
    elif run.returncode == 0 and evidence is not None:
        doubt = evidence(run)
        if doubt:
            result.failures.append(doubt)


def failure_text(result: MemorySafetyResult) -> str:
    """What a failed item says: the case and the tools, each finding and failure, the notes."""
    tools = ", ".join(f"{tool}: {state}" for tool, state in result.tools.items())
    said = [*result.findings, *result.failures]   # the first line (a result's reason) says what failed first
    why = f": {said[0].splitlines()[0].strip().removesuffix(':')}" if said else ""
    lines = [f"memory safety of {result.workdir} on case {result.case}{why} (PYTORCH_NO_CUDA_MEMORY_CACHING=1; {tools}):"]
    lines += [f"  {line}" for line in result.findings]
    lines += result.failures
    lines += [f"note: {note}" for note in result.notes[:10]]
    if len(result.notes) > 10:
        lines.append(f"note: ... and {len(result.notes) - 10} more")
    return "\n".join(lines)


@dataclass
class Begun:
    """A memory-safety case sent to its children (`begin`), to be decided by `conclude`."""

    key: tuple
    sanitized: Sanitized
    result: MemorySafetyResult
    want: list
    build_dir: Path
    limit: float
    started: float


def _extension(workdir: Any) -> str:
    """The loaded workdir's extension as built (its worker's, else this process's)."""
    so = workdir.worker.extension if workdir.worker is not None else workdir.extension.__file__
    return str(Path(so).resolve())


def key_of(workdir: Any, settings: Any, sanitizer: str) -> tuple:
    """What a case's children must match to judge the loaded `workdir` (Sanitized.key_of)."""
    return Sanitized.key_of(workdir.path, _extension(workdir), settings.device, getattr(settings, "sandbox", "off"),
                            sanitizer)


def begin(workdir: Any, settings: Any, seed: int, sanitizer: str, ahead: Sanitized | None = None) -> Begun:
    """Draw one small case of the loaded `workdir` (its extension as built) and send it to the three tools'
    children, which run it at once. `ahead`: the children started for this workdir and extension while it
    loaded, if still waiting (else fresh ones)."""
    case = small_case(workdir.reference, settings)
    extension = _extension(workdir)
    build_dir = Path(extension).parent
    if build_dir.name == "loaded":  # a rebuilt extension is loaded from a copy beside the build
        build_dir = build_dir.parent
    result = MemorySafetyResult(workdir=str(workdir.path), test="", case=shapes.format_case(case) or "canonical",
                                passed=False)
    limit = time_limit(settings)
    started = time.perf_counter()
    from pytest_cudaopt.candidate.load import saved_rng

    with saved_rng():   # the case's draws seed the global generators: no item after it sees the difference
        sent, want = draw_case(workdir, case, seed, settings.device)
    sandbox = getattr(settings, "sandbox", "off")
    key = key_of(workdir, settings, sanitizer)
    if ahead is not None and (ahead.key != key or not ahead.waiting()):   # another build, or gone: afresh
        ahead.close()
        ahead = None
    sanitized = ahead or Sanitized(workdir.path, extension, settings.device, sandbox, sanitizer, wait=limit)
    try:
        sanitized.send(sent)
    except BaseException:
        sanitized.close()
        raise
    return Begun(key, sanitized, result, want, build_dir, limit, started)


def conclude(begun: Begun, workdir: Path, test: str, paused: Callable[[], float] = lambda: 0.0,
             between: Callable[[], None] = lambda: None) -> MemorySafetyResult:
    """Wait for the children of `begun` and decide; memcheck's findings stop the others. `paused()`: seconds they
    were stopped since the case was sent (their time limit grows by them). `between`: a pause point, run while
    they are waited on (a judge's check child: another workdir's turn waits for no sanitizer run)."""
    result, sanitized = begun.result, begun.sanitized
    result.test = test
    try:
        decided = False
        for tool, child in sanitized.children.items():  # memcheck first
            if decided:  # not worth the others' time
                child.kill()
                result.tools[tool] = f"stopped ({REQUIRED} decided)"
                continue
            run = child.finish(lambda: begun.limit + paused() - (time.perf_counter() - begun.started), between)
            result.seconds_by_tool[tool] = run.seconds
            judge_run(run, Path(workdir), begun.build_dir, result,
                      lambda run: call_evidence(run, sanitized.child_scratch / run.tool, begun.want))
            decided = tool == REQUIRED and bool(result.failures or result.findings)
    finally:
        sanitized.close()
    result.seconds = time.perf_counter() - begun.started
    result.passed = not result.findings and not result.failures
    return result
