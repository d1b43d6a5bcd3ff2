"""The build stage's child: the workdir's extension compiled, not loaded, with the settings its pytest children will resolve.
Exit 0 built, 1 the build failed, 2 pytest could not start, 3 (TIMEOUT_CODE) the memory estimate did not end in time."""
from __future__ import annotations

import os
import sys
from pathlib import Path


# Before the compiler's report in the child's output: what the build stage's line shows as its reason.
REPORT_MARK = "cudaopt judge: the build's report:"
# Before the device bytes one check of this problem may take (read by stages.read_build).
NEED_MARK = "cudaopt judge: one check may take bytes:"
# The exit status of a build stage whose memory estimate hung (model.py's import, most likely).
TIMEOUT_CODE = 3


def check_need(workdir: Path, max_elements: int | None = None) -> int | None:
    """The device memory one check of this problem may take, from its reference on meta: the largest case's budget
    and the reference's intermediates there, plus three copies of Model's parameters (the reference, float64,
    ModelNew); None when it does not run on meta."""
    try:
        from pytest_cudaopt.correctness.shapes import shape_space
        from pytest_cudaopt.primitives.memory import largest_case_budget, weights_on_meta
        from pytest_cudaopt.workdir import import_file, module_prefix

        reference = import_file(f"{module_prefix(workdir)}.need", workdir / "model.py", workdir,
                                {"cuda_extension": None, "model": None})
        space = shape_space(reference, max_elements)   # the check's own size cap, before free memory shrinks it
        if not space.meta_usable:
            return None
        weights = weights_on_meta(reference)
        drawn = space.max_elements if space.strategy is not None else None   # nothing to draw: the canonical case
        return largest_case_budget(space.canonical_bytes, space.canonical_elements, drawn,
                                   space.canonical_work) + 3 * weights
    except Exception:  # noqa: BLE001 - an estimate, never a verdict
        return None


def estimate_within(workdir: Path, settings) -> tuple[int | None, str]:
    """`check_need` under the watchdog: (need, "") or (None, the report); an uninterruptible hang exits TIMEOUT_CODE."""
    from pytest_cudaopt.run.supervision import workdir_frames
    from pytest_cudaopt.run.watchdog import HangTimeout, Watchdog, main_stack

    def stuck(message: str) -> None:
        print(f"{REPORT_MARK}\n{message}\nwhere it was (innermost last):\n{main_stack()}", file=sys.stderr, flush=True)
        os._exit(TIMEOUT_CODE)

    dog = Watchdog(settings.timeout, f"the build stage of {workdir}", on_stuck=stuck)
    dog.stage = "importing model.py and running its Model on the meta device (the memory estimate)"
    try:
        with dog:
            return check_need(workdir, settings.max_elements), ""
    except HangTimeout as exc:
        where = workdir_frames(exc, workdir) or "  (not in the workdir's files)"
        return None, f"{dog.message()}\nwhere it was:\n{where}"


class BuildPlugin:
    """Compiles the workdir once collection has resolved the session's settings."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.code: int | None = None
        self.report = ""

    def pytest_collection_finish(self, session) -> None:
        from pytest_cudaopt import extension as build
        from pytest_cudaopt.plugin import SESSION_KEY

        settings = session.config.stash[SESSION_KEY].settings
        try:
            result = build.compile_extension(self.workdir, settings=settings,
                                             emit=lambda line: print(f"cudaopt build: {line}", flush=True))
        except build.BuildError as exc:
            self.report = exc.report()  # printed once pytest is done: nothing of pytest's comes after it
            self.code = 1
            return
        print(build.describe(result), flush=True)
        need, hung = estimate_within(self.workdir, settings)
        if hung:
            self.report, self.code = hung, TIMEOUT_CODE
            return
        if need is not None:
            print(f"{NEED_MARK} {need}", flush=True)
        self.code = 0


def main(argv: list[str]) -> int:
    from pytest_cudaopt.launch import run_pytest

    if not argv:
        print("usage: python -m pytest_cudaopt.judge.child_build WORKDIR [PYTEST_ARGS...]", file=sys.stderr)
        return 2
    workdir = Path(argv[0]).resolve()
    plugin = BuildPlugin(workdir)
    status = run_pytest([str(workdir / "model_new.py"), "--rootdir", str(workdir), "--collect-only", "-q",
                         "-p", "no:cacheprovider", "--assert=plain", *argv[1:]], plugins=[plugin])
    if plugin.code is None:
        print(f"cudaopt judge: pytest ended with status {status} before the build of {workdir}", file=sys.stderr)
        return 2
    if plugin.report:
        sys.stdout.flush()
        print(f"{REPORT_MARK}\n{plugin.report}", file=sys.stderr, flush=True)
    return plugin.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
