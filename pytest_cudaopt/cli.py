"""The `cudaopt` command: build, verify, profile, check, init, adopt, report. A front door, no logic."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

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


class _Ran:
    """Counts the items of one verdict kind that ran (passed or failed) and those skipped."""

    def __init__(self, marker: str):
        self.marker, self.ran, self.skipped = marker, 0, []

    def pytest_runtest_logreport(self, report) -> None:
        if self.marker not in report.keywords:
            return
        if report.when == "call":
            self.ran += 1
        elif report.when == "setup" and report.skipped:
            self.skipped.append(str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else "skipped")
        elif report.when == "setup" and report.failed:
            self.ran += 1


def _run_pytest(workdir: Path, marker: str, extra: Sequence[str]) -> int:
    """verify and profile are the plugin's own verdicts, run through pytest so that the
    command line and `pytest -m ...` can never disagree. pytest's status, but 2 for its usage
    error (4) and 5 when no item of the verdict ran (all skipped: pytest says 0)."""
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
    from pytest_cudaopt import build

    try:
        result = build.build(args.workdir, verbose=True)
    except build.BuildError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # ninja was stopped too and the lock is released.
        print("cudaopt build: interrupted", file=sys.stderr)
        return INTERRUPTED
    print(build.describe(result))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    return _run_pytest(args.workdir, "correctness", args.pytest_args)


def cmd_profile(args: argparse.Namespace) -> int:
    return _run_pytest(args.workdir, "perf", args.pytest_args)


def _extension_violations(workdir: Path) -> list:
    """EX001 against the last build on disk, when there is one (check compiles nothing)."""
    from pytest_cudaopt import build
    from pytest_cudaopt.policy.extension_names import check_extension_names

    try:
        module = build.existing_extension(workdir)
    except build.BuildError:
        return []  # the build fails to load; `cudaopt build` says why
    return check_extension_names(workdir, module) if module is not None else []


def cmd_check(args: argparse.Namespace) -> int:
    from pytest_cudaopt import policy

    violations = policy.check_workdir(args.workdir)
    violations += _extension_violations(args.workdir)
    print(policy.render(violations, args.workdir, as_json=args.json))
    return 1 if violations else 0


def cmd_init(args: argparse.Namespace) -> int:
    from pytest_cudaopt import scaffold

    try:
        if args.lock_only:
            print(f"recorded model.py, conftest.py, peers.py, utils/ and the cudaopt settings in "
                  f"{scaffold.lock_workdir(Path(args.dir))}")
            return 0
        if args.model is None:
            print("cudaopt init: --model path/to/model.py is required (or --lock-only)", file=sys.stderr)
            return 2
        notes: list[str] = []
        created = scaffold.init_workdir(Path(args.dir), Path(args.model), notes)
        for note in notes:
            print(f"cudaopt init: warning: {note}", file=sys.stderr)
    except scaffold.ScaffoldError as exc:
        print(f"cudaopt init: {exc}", file=sys.stderr)
        return 1
    print(f"created workdir {created}; next: write kernels/, then `cudaopt check {created}`"
          f" and `pytest {created} -m correctness`")
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from pytest_cudaopt import ci_gate

    return ci_gate.run(args.workdir, out=Path(args.out).resolve(), baseline_workdir=args.baseline_workdir,
                    regression_margin=args.regression_margin, pytest_args=args.pytest_args,
                    allow_lock_change=args.allow_lock_change)


def cmd_adopt(args: argparse.Namespace) -> int:
    from pytest_cudaopt import scaffold

    try:
        _, summary = scaffold.adopt_workdir(Path(args.dir))
    except scaffold.ScaffoldError as exc:
        print(f"cudaopt adopt: {exc}", file=sys.stderr)
        return 1
    print(summary)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pytest_cudaopt import jsonreport

    try:
        print(jsonreport.render_file(Path(args.json), fmt=args.format))
    except ValueError as exc:
        print(f"cudaopt report: {exc}", file=sys.stderr)
        return 2
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="cudaopt", description=DESCRIPTION)
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = top.add_subparsers(dest="command", required=True)

    def with_workdir(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("workdir", nargs="?", default=".", type=_workdir,
                       help="the workdir (a folder with model.py); default: the current folder")
        return p

    with_workdir("build", "compile the workdir's cuda_extension and print the build time"
                 ).set_defaults(func=cmd_build)
    for name, func, help in (
        ("verify", cmd_verify, "run the correctness verdict (pytest -m correctness) and print its table"),
        ("profile", cmd_profile, "run the speed verdict (pytest -m perf) and print its table"),
    ):
        p = with_workdir(name, help)
        p.add_argument("pytest_args", nargs=argparse.REMAINDER,
                       help="further pytest arguments, e.g. --cudaopt-profile=thorough")
        p.set_defaults(func=func)
    p = with_workdir("check", "check the workdir rules statically; non-zero exit on any violation")
    p.add_argument("--json", action="store_true", help="print the violations as JSON")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("init", help="create a workdir around a model.py")
    p.add_argument("dir", help="the folder to create (must not exist or be empty)")
    p.add_argument("--model", help="path to the reference model.py (KernelBench format)")
    p.add_argument("--lock-only", action="store_true",
                   help="only (re)record what DIR/cudaopt.lock protects (an existing workdir, after an intended change)")
    p.set_defaults(func=cmd_init)
    p = with_workdir("gate", "the CI gate: policy, correctness and perf in one pytest session; exit 0 passed, "
                             "1 a verdict failed, 2 bad arguments or interrupted, 3 broken setup (no GPU, nothing "
                             "collected, a verdict not run)")
    p.add_argument("--out", default="cudaopt-gate", help="folder for report.json, junit.xml and summary.md "
                                                         "(default: ./cudaopt-gate)")
    p.add_argument("--baseline-workdir", type=_workdir, default=None,
                   help="a checkout of the target branch's workdir: its ModelNew is timed beside the candidate")
    p.add_argument("--regression-margin", type=float, default=None,
                   help="how much slower than the target branch the candidate may be (default 0.03)")
    p.add_argument("--allow-lock-change", action="store_true",
                   help="accept a cudaopt.lock that differs from the baseline workdir's (the owner's pull requests)")
    p.set_defaults(func=cmd_gate, pytest_args=[])  # further arguments (after `--`) go to pytest

    p = sub.add_parser("adopt", help="record the lock of an existing workdir (not made by `cudaopt init`) "
                       "and say what its fixed files and bindings are; changes no other file")
    p.add_argument("dir", nargs="?", default=".", help="the workdir; default: the current folder")
    p.set_defaults(func=cmd_adopt)
    p = sub.add_parser("report", help="render a --cudaopt-report JSON file")
    p.add_argument("json", help="the JSON file written by --cudaopt-report")
    p.add_argument("--format", choices=("table", "markdown"), default="table")
    p.set_defaults(func=cmd_report)
    return top


def _version() -> str:
    from pytest_cudaopt import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit status (docs/results.md lists every one): 2 for a usage error."""
    top = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passed_on: list[str] = []
    if argv[:1] == ["gate"] and "--" in argv:  # `cudaopt gate [options] [WORKDIR] -- PYTEST_ARGS`
        cut = argv.index("--")
        argv, passed_on = argv[:cut], argv[cut + 1:]
    args, unknown = top.parse_known_args(argv)
    if args.command == "gate":
        if unknown:
            top.error(f"unrecognized arguments: {' '.join(unknown)} (arguments for pytest go after `--`)")
        args.pytest_args = passed_on
    elif unknown:
        if hasattr(args, "pytest_args"):
            # `cudaopt verify --cudaopt-device=cpu` (workdir omitted): options before the
            # workdir that argparse does not know are pytest's.
            args.pytest_args = unknown + list(args.pytest_args)
        else:
            top.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
