"""The `cudaopt` command: build, verify, profile, check, init, adopt, gate, judge, report. A front door, no logic."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Sequence

from pytest_cudaopt import __version__

DESCRIPTION = (
    "Judge a workdir that accelerates a PyTorch model (model.py) with a hand-written CUDA C++ "
    "extension (model_new.py + kernels/): build it, verify it against model.py on many shapes, "
    "time it against torch.compile, check the workdir rules, create a workdir, render a report.")


def _workdir(text: str) -> Path:
    path = Path(text).resolve()
    if not (path / "model.py").is_file():
        raise argparse.ArgumentTypeError(f"{path} is not a workdir: it has no model.py")
    return path


# Exit statuses of the commands (docs/results.md): besides 0 and 1 (a verdict failed), a usage
# error and an interrupt are 2 everywhere, and a verdict none of whose items ran is 5.
USAGE = INTERRUPTED = 2
NOTHING_RAN = 5


def _error(command: str, message: object, code: int) -> int:
    """`cudaopt COMMAND: message` on stderr; returns the exit status `code`."""
    print(f"cudaopt {command}: {message}", file=sys.stderr)
    return code


class _Ran:
    """Counts the items of one verdict kind that ran (passed or failed) and those skipped."""

    def __init__(self, marker: str):
        self.marker, self.ran, self.skipped = marker, 0, []

    def pytest_runtest_logreport(self, report) -> None:
        if self.marker not in report.keywords:
            return
        if report.when == "setup" and report.skipped:
            self.skipped.append(str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else "skipped")
        elif report.when == "call" or (report.when == "setup" and report.failed):
            self.ran += 1


def _run_pytest(workdir: Path, marker: str, extra: Sequence[str]) -> int:
    """verify and profile run through pytest, so they and `pytest -m ...` never disagree: pytest's status,
    but 2 for its usage error (4) and 5 when no item of the verdict ran (all skipped: pytest says 0)."""
    from pytest_cudaopt.launch import run_pytest

    ran = _Ran(marker)
    code = run_pytest([str(workdir / "model_new.py"), "-m", marker, "--rootdir", str(workdir), "-q", *extra],
                      plugins=[ran])
    if code == 4:
        return USAGE
    if code in (0, 5) and not ran.ran:
        why = f": {len(ran.skipped)} skipped ({ran.skipped[0].removeprefix('Skipped: ')})" if ran.skipped else ""
        print(f"cudaopt: no {marker} item ran{why}; nothing was judged", file=sys.stderr)
        return NOTHING_RAN
    return code


def cmd_build(args: argparse.Namespace) -> int:
    from pytest_cudaopt import extension as build
    from pytest_cudaopt.suite.settings import SettingError

    try:
        result = build.build(args.workdir, verbose=True)
    except SettingError as exc:
        return _error("build", exc, USAGE)
    except build.BuildError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _error("build", "interrupted", INTERRUPTED)  # ninja was stopped too and the lock is released
    print(build.describe(result))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from pytest_cudaopt import policy
    from pytest_cudaopt.suite.settings import SettingError, workdir_settings

    try:
        limit = workdir_settings(args.workdir).timeout   # MN010 runs the workdir's code: cudaopt_timeout
    except SettingError as exc:
        return _error("check", exc, USAGE)
    config = policy.load_config(Path(args.workdir).resolve())
    violations = policy.check_workdir(args.workdir, config, construct=False)
    # MN010 and EX001 run in a worker, with the one build (a stand-in without): this process imports no workdir code.
    so, unbuilt = _current_build(args.workdir)
    violations = sorted(set(violations) | set(_worker_findings(Path(args.workdir), so, limit,
                                                                "MN010" not in config.disable)))
    print(policy.render(violations, args.workdir, as_json=args.json, built=so is not None, unbuilt=unbuilt))
    return 1 if violations else 0


def _current_build(workdir: Path) -> tuple[Path | None, str]:
    """(the .so EX001 reads, "") or (None, why there is none). A workdir built before is rebuilt where its tree
    changed (EX001 reads what kernels/ defines now); one never built is not built here."""
    from pytest_cudaopt import extension as build

    try:
        so = build.existing_build(workdir)
    except build.BuildError:
        so = None
    if so is None:
        return None, "no build yet (`cudaopt build`)"
    try:
        emit = lambda line: print(f"cudaopt check: {line}", file=sys.stderr, flush=True)  # noqa: E731
        return build.compile_extension(workdir, emit=emit).so_path, ""
    except (build.BuildError, ValueError) as exc:
        summary = str(getattr(exc, "summary", exc)).splitlines()[0]
        return None, (f"the build predates the latest edits and rebuilding it failed: {summary} "
                      f"(`cudaopt build {workdir}` shows the compiler's errors)")


def _worker_findings(workdir: Path, so: Path | None, limit: float, mn010: bool) -> list:
    """MN010's and EX001's violations from a worker; one that hangs past `limit` seconds or dies is an MN010."""
    from pytest_cudaopt.policy import worker_violations
    from pytest_cudaopt.policy.rules import Violation
    from pytest_cudaopt.remote.worker import Worker, WorkerError, WorkerFailed
    from pytest_cudaopt.run.supervision import worker_frames
    from pytest_cudaopt.suite.settings import SettingError, workdir_settings

    if not mn010 and so is None:
        return []
    try:
        mode = workdir_settings(workdir).sandbox
    except SettingError:
        mode = "auto"
    worker = Worker(workdir, so, "cpu", sandbox=mode)
    try:
        worker.start(require_workdir=False)
        reply = worker.request({"op": "policy", "mn010": mn010, "ex001": so is not None},
                               timeout=limit or None, what="importing model_new.py and constructing ModelNew")
        return worker_violations(workdir, reply)
    except WorkerFailed as exc:
        frames = worker_frames(getattr(exc, "worker_stacks", ""), workdir)
        file, line = (frames[0][0], frames[0][1]) if frames else ("model_new.py", 1)
        if getattr(exc, "worker_stacks", None) is not None:  # it hung past the limit
            return [Violation(file, line, "MN010", f"model_new.py's import and ModelNew(*get_init_inputs()) did not "
                                                   f"end within cudaopt_timeout={limit:g}s")]
        return [Violation(file, line, "MN010", str(exc).splitlines()[0])]
    except WorkerError as exc:
        return [Violation("model_new.py", 1, "MN010", str(exc).splitlines()[0])]
    finally:
        worker.stop()


def cmd_init(args: argparse.Namespace) -> int:
    from pytest_cudaopt.commands import scaffold

    try:
        if args.lock_only:
            print(f"recorded model.py, conftest.py, peers.py, utils/ and the cudaopt settings in "
                  f"{scaffold.lock_workdir(Path(args.dir))}")
            return 0
        if args.model is None:
            return _error("init", "--model path/to/model.py is required (or --lock-only)", USAGE)
        notes: list[str] = []
        created = scaffold.init_workdir(Path(args.dir), Path(args.model), notes, device=args.device)
        for note in notes:
            print(f"cudaopt init: warning: {note}", file=sys.stderr)
    except scaffold.ScaffoldError as exc:
        return _error("init", exc, 1)
    remembered = f" (its device, {args.device}, is recorded in pyproject.toml)" if args.device != "cuda" else ""
    print(f"created workdir {created}{remembered}; its README.md says what to edit; next: write kernels/, then "
          f"`cudaopt check {created}` and `pytest {created} -m correctness`")
    from pytest_cudaopt.correctness.sizes import check_new_workdir

    too_big = check_new_workdir(created, args.device)
    if too_big:
        print(f"cudaopt init: warning: {too_big}", file=sys.stderr)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from pytest_cudaopt.commands import gate as ci_gate

    return ci_gate.run(args.workdir, out=Path(args.out).resolve(), baseline_workdir=args.baseline_workdir,
                    regression_margin=args.regression_margin, pytest_args=args.pytest_args,
                    allow_lock_change=args.allow_lock_change)


def cmd_adopt(args: argparse.Namespace) -> int:
    from pytest_cudaopt.commands import scaffold

    try:
        _, summary = scaffold.adopt_workdir(Path(args.dir))
    except scaffold.ScaffoldError as exc:
        return _error("adopt", exc, 1)
    print(summary)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pytest_cudaopt.results import jsonreport

    try:
        print(jsonreport.render_file(Path(args.json), fmt=args.format))
    except ValueError as exc:
        return _error("report", exc, USAGE)
    return 0


def cmd_judge(args: argparse.Namespace) -> int:
    from pytest_cudaopt import judge
    from pytest_cudaopt.judge.display import Progress, summary
    from pytest_cudaopt.judge.lines import unwritable

    low = [f"{flag} {value}" for flag, value, least in (("--share", args.share, 1), ("--jobs", args.jobs, 1),
                                                       ("--ahead", args.ahead, 0), ("--cpu-slots", args.cpu_slots, 1))
           if value is not None and value < least]
    if low:
        return _error("judge", f"{', '.join(low)}: --share, --jobs and --cpu-slots take 1 or more, --ahead 0 or more",
                      USAGE)
    options = judge.Options(
        gpus=[g for g in args.gpus.split(",") if g] if args.gpus not in (None, "all") else None,
        cpu_slots=args.cpu_slots, jobs=args.jobs, share=args.share, ahead=args.ahead,
        timeout=args.timeout, pytest_args=list(args.pytest_args), all_stages=args.all_stages, seed=args.seed,
        cache_dir=None if args.no_cache else (Path(args.cache_dir) if args.cache_dir else judge.Options().cache_dir),
        scratch=Path(args.scratch) if args.scratch else None, keep=args.keep, keep_env=list(args.env),
        fork=not args.no_fork, environment_retries=args.environment_retries, backstop=args.backstop)
    if args.serve:
        from pytest_cudaopt.judge.stdio import serve

        clash = [name for name, given in (("PATHS", args.paths), ("--ray", args.ray), ("--resume", args.resume)) if given]
        if clash:
            return _error("judge", f"--serve reads the workdirs from stdin and writes the lines to stdout; "
                          f"drop {', '.join(clash)}", USAGE)
        return serve(options)
    if not args.paths:
        return _error("judge", "name the workdirs (or folders holding them), or --serve to read them from stdin", USAGE)
    out = Path(args.out).resolve()
    if why := unwritable(out):
        return _error("judge", f"--out {args.out}: {why}", USAGE)
    terminated = []

    def on_sigterm(signum, frame) -> None:   # as Ctrl-C: children ended, unfinished workdirs' lines `cancelled`
        terminated.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        written = judge.run(args.paths, options, out=out, ray=args.ray, resume=args.resume, progress=Progress(0))
    except KeyboardInterrupt:
        return _error("judge", f"interrupted; the lines so far (unfinished workdirs as cancelled) are in {out}",
                      128 + signal.SIGTERM if terminated else 130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summary(written.lines, wall_s=written.wall_s, busy=written.busy, root=Path.cwd()))
    kept = f" ({written.kept} kept from the earlier run)" if written.kept else ""
    print(f"cudaopt judge: {len(written.lines)} lines{kept} in {out}; exit {written.code}")
    return written.code


def _judge_parser(sub) -> None:
    p = sub.add_parser("judge", help="judge many workdirs, each in processes of its own, over every GPU of this "
                       "host (or a Ray cluster); one JSON line per workdir",
                       description="Judge many workdirs: build (CPU), policy (CPU), correctness (GPUs may be "
                       "shared) and perf (alone on its GPU), each a fresh process with a time limit on a private copy. "
                       "Arguments after `--` go to every pytest child (e.g. -- --cudaopt-device=cpu). Exit 0 all "
                       "passed, 1 some failed, 2 bad arguments, 3 some could not be judged.")
    p.add_argument("paths", nargs="*", help="workdirs, or folders holding workdirs")
    p.add_argument("--gpus", default=None, help="GPU indices to use, comma separated (default: all visible)")
    p.add_argument("--cpu-slots", type=int, default=2,
                   help="slots for CPU workdirs (--cudaopt-device=cpu after --); default 2")
    p.add_argument("--jobs", type=int, default=None, help="builds and policy checks at once (default: half "
                   "the cores; with --ray, of each node)")
    p.add_argument("--share", type=int, default=4, help="correctness processes at once on one GPU while their "
                   "memory fits (default 4); a perf process always has its GPU alone")
    p.add_argument("--ahead", type=int, default=None, metavar="N", help="check and perf processes per GPU that start "
                   "up (imports, collection) before a place is free for them (default: --share on GPUs, 0 for CPU "
                   "workdirs; 0: each starts with its place)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each process may run (default 600)")
    p.add_argument("--out", default="cudaopt-judge.jsonl", help="the JSON-lines file (default ./cudaopt-judge.jsonl)")
    p.add_argument("--resume", action="store_true", help="keep the lines of --out that judged an unchanged "
                   "workdir, and judge only the others")
    p.add_argument("--ray", default=None, metavar="ADDRESS", help="judge on a Ray cluster: auto, or its address "
                   "(needs the ray extra: pip install -e '.[ray]')")
    p.add_argument("--all-stages", action="store_true", help="run correctness and perf even after an earlier "
                   "stage failed (as one pytest session does)")
    p.add_argument("--environment-retries", type=int, default=2, metavar="N", help="judge a workdir again, up to N "
                   "times, while its line blames the environment (a busy device, memory held by others); its one "
                   "line is the last attempt's (default: 2)")
    p.add_argument("--seed", type=int, default=None, help="replay with this seed (it is then on the children's "
                   "command lines; by default each child draws a secret one)")
    p.add_argument("--cache-dir", default=None, help="the host's object and torch.compile caches "
                   "(default ~/.cache/cudaopt)")
    p.add_argument("--no-cache", action="store_true", help="no shared caches")
    p.add_argument("--scratch", default=None, help="where the private copies go (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the private copies and the children's logs")
    p.add_argument("--no-fork", "--no-prestart", dest="no_fork", action="store_true",
                   help="execute each stage's child as a fresh Python (by default it is forked from a process of the "
                   "judge's that imported torch once)")
    p.add_argument("--env", action="append", default=[], metavar="NAME",
                   help="an environment variable the children keep (the environment is scrubbed otherwise)")
    p.add_argument("--serve", action="store_true", help="a warm service: read one workdir a line from stdin (a path, "
                   "or {\"path\": ..., \"id\": ...}), write each one's JSON line to stdout as it finishes; end of "
                   "input drains, SIGTERM cancels what is queued (exit 143)")
    p.add_argument("--backstop", type=float, default=None, metavar="S", help="with --serve: seconds a workdir may "
                   "take from its first stage to its line, whatever its children do (default: the stages' limits "
                   "added up, plus 60)")
    p.set_defaults(func=cmd_judge, pytest_args=[])


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="cudaopt", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    def with_workdir(name: str, help: str, func, **defaults) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("workdir", nargs="?", default=".", type=_workdir,
                       help="the workdir (a folder with model.py); default: the current folder")
        p.set_defaults(func=func, **defaults)
        return p

    with_workdir("build", "compile the workdir's cuda_extension and print the build time", cmd_build)
    for name, marker, help in (
        ("verify", "correctness", "run the correctness verdict (pytest -m correctness) and print its table"),
        ("profile", "perf", "run the speed verdict (pytest -m perf) and print its table")):
        p = with_workdir(name, help, lambda args, marker=marker: _run_pytest(args.workdir, marker, args.pytest_args))
        p.add_argument("pytest_args", nargs=argparse.REMAINDER,
                       help="further pytest arguments, e.g. --cudaopt-profile=thorough")
    p = with_workdir("check", "check the workdir rules statically; non-zero exit on any violation", cmd_check)
    p.add_argument("--json", action="store_true", help="print the violations as JSON")
    p = sub.add_parser("init", help="create a workdir around a model.py")
    p.add_argument("dir", help="the folder to create (must not exist or be empty)")
    p.add_argument("--model", help="path to the reference model.py (KernelBench format)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="the starting kernel in kernels/: cuda (a .cu file) or cpu (C++, for --cudaopt-device=cpu); "
                        "default: cuda")
    p.add_argument("--lock-only", action="store_true",
                   help="only (re)record what DIR/cudaopt.lock protects (an existing workdir, after an intended change)")
    p.set_defaults(func=cmd_init)
    p = with_workdir("gate", "the CI gate: policy, correctness and perf in one pytest session; exit 0 passed, "
                             "1 a verdict failed, 2 bad arguments or interrupted, 3 broken setup (no GPU, nothing "
                             "collected, a verdict not run)",
                     cmd_gate, pytest_args=[])  # further arguments (after `--`) go to pytest
    p.add_argument("--out", default="cudaopt-gate", help="folder for report.json, junit.xml and summary.md "
                                                         "(default: ./cudaopt-gate)")
    p.add_argument("--baseline-workdir", type=_workdir, default=None,
                   help="a checkout of the target branch's workdir: its ModelNew is timed beside the candidate")
    p.add_argument("--regression-margin", type=float, default=None,
                   help="how much slower than the target branch the candidate may be (default 0.03)")
    p.add_argument("--allow-lock-change", action="store_true",
                   help="accept a cudaopt.lock that differs from the baseline workdir's (the owner's pull requests)")

    p = sub.add_parser("adopt", help="record the lock of an existing workdir (not made by `cudaopt init`) "
                       "and say what its fixed files and bindings are; changes no other file")
    p.add_argument("dir", nargs="?", default=".", help="the workdir; default: the current folder")
    p.set_defaults(func=cmd_adopt)
    _judge_parser(sub)
    p = sub.add_parser("report", help="render a --cudaopt-report JSON file")
    p.add_argument("json", help="the JSON file written by --cudaopt-report")
    p.add_argument("--format", choices=("table", "markdown"), default="table")
    p.set_defaults(func=cmd_report)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit status (docs/results.md lists every one): 2 for a usage error."""
    top = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passed_on: list[str] | None = None
    # `cudaopt gate [options] [WORKDIR] -- PYTEST_ARGS`, `cudaopt judge PATHS... -- PYTEST_ARGS`
    if argv[:1] in (["gate"], ["judge"]) and "--" in argv:
        cut = argv.index("--")
        argv, passed_on = argv[:cut], argv[cut + 1:]
    args, unknown = top.parse_known_args(argv)
    if args.command in ("gate", "judge"):
        if unknown:
            top.error(f"unrecognized arguments: {' '.join(unknown)} (arguments for pytest go after `--`)")
        args.pytest_args = passed_on or []
    elif unknown:
        if hasattr(args, "pytest_args"):
            # `cudaopt verify --cudaopt-device=cpu` (workdir omitted): unknown options before it are pytest's.
            args.pytest_args = unknown + list(args.pytest_args)
        else:
            top.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
