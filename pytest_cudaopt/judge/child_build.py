"""The build stage's child: the workdir's extension compiled, not loaded, with the settings its pytest children will resolve.

Run as `python -m pytest_cudaopt.judge.child_build WORKDIR [PYTEST_ARGS...]`: a pytest session
that only collects (command line, environment and ini resolved as in the judging children, so
their in-process build finds everything up to date), then compiles. No candidate code runs:
model_new.py is not imported and the built module is not loaded. Exit 0 built, 1 the build
failed (the compiler's report on stderr), 2 pytest could not start.
"""

from __future__ import annotations

import sys
from pathlib import Path


# Before the compiler's report in the child's output: what the build stage's line shows as its
# reason (the collected items and the progress lines above it are left out).
REPORT_MARK = "cudaopt judge: the build's report:"


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
