"""Compiler diagnostics: the `file:line: error` lines of a failed build, relative to the workdir (pure functions)."""

from __future__ import annotations

import re
from pathlib import Path

MAX_REPORTED_ERRORS = 20  # shown in a BuildError report; the rest is in build.log


class BuildError(Exception):
    """The extension did not build or load. `report()` is what a user should see: the
    compiler's own `file:line: error` lines and a one-line summary, no traceback."""

    def __init__(self, summary: str, diagnostics: list[str] | None = None, log_path: Path | None = None):
        super().__init__(summary)
        self.summary = summary
        self.diagnostics = list(diagnostics or [])
        self.log_path = log_path

    def report(self) -> str:
        return "\n".join([*self.diagnostics, self.summary])

    def __str__(self) -> str:
        return self.report()


_GCC_DIAG = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
                       r"(?P<kind>fatal error|error|warning|note):\s*(?P<msg>.*)$")
_NVCC_DIAG = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s*"
                        r"(?P<kind>catastrophic error|error|warning|remark)(?:\s*#[\w-]+)?:\s*(?P<msg>.*)$")
_LINK_ERR = re.compile(r"(undefined reference to|ld returned|cannot find -l|ld: error)")


def _workdir_path(workdir: Path, build_dir: Path, raw: str) -> str:
    """A path the compiler printed (relative to the build folder), relative to the workdir."""
    path = Path(raw)
    full = (build_dir / path).resolve() if not path.is_absolute() else path.resolve()
    try:
        return full.relative_to(workdir).as_posix()
    except ValueError:
        return str(full)


_FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(?P<target>\S+)")
_INCLUDED_FROM = re.compile(r"^(?:In file included from|\s+from) (?P<file>[^:]+):(?P<line>\d+)[:,]")


def diagnostics(output: str, workdir: Path, build_dir: Path,
                sources: dict[str, str]) -> tuple[list[str], dict[str, int]]:
    """The error lines of a failed ninja run as `file:line: error: msg` (relative to the workdir), each with the
    compiler's snippet (an error in a header outside the workdir names the workdir line that included it), and the
    number of errors per failed source. `sources`: ninja's object targets -> the workdir's sources they compile."""
    lines = output.splitlines()
    shown: list[str] = []
    per_source: dict[str, int] = {}
    current = "?"
    included_from: str | None = None
    link_errors: list[str] = []
    for i, line in enumerate(lines):
        failed = _FAILED.match(line)
        if failed:
            current = sources.get(failed.group("target"), failed.group("target"))
            included_from = None
            continue
        inc = _INCLUDED_FROM.match(line)
        if inc:
            rel = _workdir_path(workdir, build_dir, inc.group("file"))
            if not Path(rel).is_absolute():
                included_from = f"{rel}:{inc.group('line')}"
            continue
        match = _GCC_DIAG.match(line) or _NVCC_DIAG.match(line)
        if match is None:
            if _LINK_ERR.search(line):
                link_errors.append(line.strip())
            continue
        if "error" not in match.group("kind"):
            if match.group("kind") != "note":
                included_from = None
            continue
        per_source[current] = per_source.get(current, 0) + 1
        if per_source[current] > MAX_REPORTED_ERRORS:
            continue
        rel = _workdir_path(workdir, build_dir, match.group("file"))
        col = f"{match.group('col')}:" if match.groupdict().get("col") else ""
        text = f"{rel}:{match.group('line')}:{col} {match.group('kind')}: {match.group('msg')}"
        if Path(rel).is_absolute() and included_from:
            text += f"  [included from {included_from}]"
        shown.append(text)
        # The compiler's snippet and caret (gcc: "  5 |   foo();", nvcc: indented lines).
        for follow in lines[i + 1:i + 4]:
            if not follow.startswith(" ") or not follow.strip() or _INCLUDED_FROM.match(follow) \
                    or _GCC_DIAG.match(follow) or _NVCC_DIAG.match(follow):
                break
            shown.append(follow)
    if link_errors and not per_source:
        shown = link_errors[:MAX_REPORTED_ERRORS]
    return shown, per_source

