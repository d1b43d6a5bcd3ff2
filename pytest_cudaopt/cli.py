"""The `cudaopt` command: build, verify, profile, check, init, adopt, report. A front door, no logic."""

from __future__ import annotations

import argparse
import sys
from functools import lru_cache
from pathlib import Path
from typing import Sequence


def _workdir(text: str) -> Path:
    path = Path(text).resolve()
    if not (path / "model.py").is_file():
        raise argparse.ArgumentTypeError(f"{path} is not a workdir: it has no model.py")
    return path


def _run_pytest(workdir: Path, marker: str, extra: Sequence[str]) -> int:
    """verify and profile are the plugin's own verdicts, run through pytest so that the
    command line and `pytest -m ...` can never disagree."""
    import pytest

    args = [str(workdir / "model_new.py"), "-m", marker, "-p", "pytest_cudaopt.plugin",
            "--rootdir", str(workdir), "-q", *extra]
    # The plugin may already be registered through its entry point.
    if "pytest_cudaopt.plugin" in sys.modules or entry_point_installed():
        args.remove("-p")
        args.remove("pytest_cudaopt.plugin")
    return int(pytest.main(args))


@lru_cache(maxsize=None)
def entry_point_installed() -> bool:
    """True when the installed package's pytest11 entry point loads the plugin by itself."""
    from importlib.metadata import entry_points

    return any(ep.value == "pytest_cudaopt.plugin" for ep in entry_points(group="pytest11"))


def cmd_build(args: argparse.Namespace) -> int:
    from pytest_cudaopt import build

    try:
        result = build.build(args.workdir, verbose=True)
    except build.BuildError as exc:
        print(exc.report(), file=sys.stderr)
        return 1
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
            print(f"recorded model.py and utils/ in {scaffold.lock_workdir(Path(args.dir))}")
            return 0
        if args.model is None:
            print("cudaopt init: --model path/to/model.py is required (or --lock-only)", file=sys.stderr)
            return 2
        created = scaffold.init_workdir(Path(args.dir), Path(args.model))
    except scaffold.ScaffoldError as exc:
        print(f"cudaopt init: {exc}", file=sys.stderr)
        return 1
    print(f"created workdir {created}; next: write kernels/, then `cudaopt check {created}`"
          f" and `pytest {created} -m correctness`")
    return 0


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
    from pytest_cudaopt import report

    try:
        print(report.render_file(Path(args.json), fmt=args.format))
    except ValueError as exc:
        print(f"cudaopt report: {exc}", file=sys.stderr)
        return 2
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="cudaopt", description=__doc__)
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
                   help="only (re)record DIR's model.py and utils/ in DIR/cudaopt.lock (an existing workdir)")
    p.set_defaults(func=cmd_init)
    p = sub.add_parser("adopt", help="record the lock of an existing workdir (not made by `cudaopt init`) "
                       "and say what its fixed files and bindings are; changes no other file")
    p.add_argument("dir", nargs="?", default=".", help="the workdir; default: the current folder")
    p.set_defaults(func=cmd_adopt)
    p = sub.add_parser("report", help="render a --cudaopt-report JSON file")
    p.add_argument("json", help="the JSON file written by --cudaopt-report")
    p.add_argument("--format", choices=("table", "markdown"), default="table")
    p.set_defaults(func=cmd_report)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
