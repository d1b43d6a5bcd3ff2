"""The build stage's child: the workdir's extension compiled, not loaded, with the settings its pytest children will resolve.

Run as `python -m pytest_cudaopt.judge.child_build WORKDIR [PYTEST_ARGS...]`: a pytest session
that only collects (command line, environment and ini resolved as in the judging children, so
their in-process build finds everything up to date), then compiles. No candidate code runs:
model_new.py is not imported and the built module is not loaded. After a build, the reference
runs on the meta device for the memory one check may take (`check_need`), which the scheduler
uses before the problem's first check. Exit 0 built, 1 the build failed (the compiler's report
on stderr), 2 pytest could not start.
"""

from __future__ import annotations

import sys
from pathlib import Path


# Before the compiler's report in the child's output: what the build stage's line shows as its
# reason (the collected items and the progress lines above it are left out).
REPORT_MARK = "cudaopt judge: the build's report:"
# Before the device bytes one check of this problem may take (read by stages.read_build).
NEED_MARK = "cudaopt judge: one check may take bytes:"


def check_need(workdir: Path) -> int | None:
    """The device memory one check of this workdir's problem may take, from its reference on
    the meta device (model.py is the owner's locked code; nothing of the candidate runs): the
    canonical case's budget (memory.case_budget) plus three copies of Model's parameters (the
    reference's, its float64 copy, ModelNew's). None when the reference does not run on meta:
    the scheduler then learns the need from the first check."""
    try:
        import torch

        from pytest_cudaopt.correctness.shapes import check_on_meta
        from pytest_cudaopt.memory import case_budget
        from pytest_cudaopt.workdir import import_file, module_prefix

        reference = import_file(f"{module_prefix(workdir)}.need", workdir / "model.py", workdir,
                                {"cuda_extension": None, "model": None})
        case = check_on_meta(reference, {})
        if not case.valid:
            return None
        with torch.device("meta"):
            model = reference.Model(*reference.get_init_inputs())
        weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
        return case_budget(case.input_bytes, case.output_bytes) + 3 * weights
    except Exception:  # noqa: BLE001 - an estimate, never a verdict
        return None


class BuildPlugin:
    """Compiles the workdir once collection has resolved the session's settings."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.code: int | None = None
        self.report = ""

    def pytest_collection_finish(self, session) -> None:
        from pytest_cudaopt import build
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
        need = check_need(self.workdir)
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
                         "-p", "no:cacheprovider", *argv[1:]], plugins=[plugin])
    if plugin.code is None:
        print(f"cudaopt judge: pytest ended with status {status} before the build of {workdir}", file=sys.stderr)
        return 2
    if plugin.report:
        sys.stdout.flush()
        print(f"{REPORT_MARK}\n{plugin.report}", file=sys.stderr, flush=True)
    return plugin.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
