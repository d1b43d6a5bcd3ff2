"""compute-sanitizer's report (memcheck, racecheck, initcheck) read into findings, each mapped to the workdir's `kernels/x.cu:line`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# Every line of compute-sanitizer's own output starts with this prefix; a record's first line
# follows it directly, its details are indented below it.
_PREFIX = re.compile(r"^=========(?: |$)")
_SUMMARY = re.compile(r"^(?:ERROR SUMMARY: (?P<errors>\d+) errors?|RACECHECK SUMMARY: .*|LEAK SUMMARY.*"
                      r"|COMPUTE-SANITIZER.*|CUDA-MEMCHECK.*)$")
# `... in kernels/x.cu:44` (12.x and later) or `... in /path/x.cu:44:kernel(...)` (older).
_LOCATION = re.compile(r"\bin (?P<file>\S+?\.(?:cu|cuh|cpp|cc|cxx|h|hpp|hxx|inl)):(?P<line>\d+)")
_FUNCTION = re.compile(r"\bat (?:0x[0-9a-fA-F]+ in \S+:\d+:)?(?P<func>.+?)(?:\+0x[0-9a-fA-F]+)?(?: in \S+)?$")
_HOST = ("Saved host backtrace", "Host Frame")


@dataclass
class Record:
    """One error compute-sanitizer reported: its lines and the device source locations they name."""

    headline: str
    details: list[str] = field(default_factory=list)
    locations: list[tuple[str, int]] = field(default_factory=list)
    kernel: str = ""


@dataclass
class Finding:
    """A record in the workdir's own kernels: `where` is `kernels/x.cu:44` (racecheck: both
    accesses), `count` how many records said the same thing there (one per thread)."""

    tool: str
    headline: str
    where: str
    kernel: str
    details: list[str]
    count: int = 1

    def line(self) -> str:
        times = f" ({self.count} times)" if self.count > 1 else ""
        details = "; ".join(self.details)
        return (f"{self.where}: {self.tool}: {self.headline}{times}" + (f" in {self.kernel}" if self.kernel else "")
                + (f"; {details}" if details else ""))


@dataclass
class Report:
    """What one tool's log says: the workdir's findings, other records as notes, its summary's error count."""

    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary_errors: int | None = None
    records: int = 0


def records(text: str) -> tuple[list[Record], int | None, list[str]]:
    """(records, the ERROR SUMMARY count or None, the lines that are neither: messages of the
    sanitizer itself, "Target application returned an error")."""
    found: list[Record] = []
    count: int | None = None
    loose: list[str] = []
    host = False
    for raw in text.splitlines():
        if not _PREFIX.match(raw):
            continue  # the application's own output (without --log-file)
        body = _PREFIX.sub("", raw, count=1).rstrip()
        if not body.strip():
            host = False
            continue
        summary = _SUMMARY.match(body)
        if summary:
            if summary["errors"] is not None:
                count = int(summary["errors"])
            continue
        if not body[0].isspace():  # a new record (or a message of the sanitizer)
            host = False
            if _is_record(body):
                found.append(Record(body.strip()))
                _locate(found[-1], body)
            else:
                loose.append(body.strip())
            continue
        if not found:
            continue
        text_line = body.strip()
        if text_line.startswith(_HOST):
            host = True
        if host:
            continue
        found[-1].details.append(text_line)
        _locate(found[-1], text_line)
    return found, count, loose


def _is_record(line: str) -> bool:
    return line.startswith(("Invalid ", "Uninitialized ", "Error: Race", "Warning: Race", "Misaligned ",
                            "Out-of-range", "Barrier error", "Malloc/Free error", "Cuda ", "Program hit ",
                            "Warp ", "Illegal ", "Hardware exception", "Unused memory", "Error: ", "Warning: "))


def _locate(record: Record, line: str) -> None:
    for match in _LOCATION.finditer(line):
        record.locations.append((match["file"], int(match["line"])))
    if not record.kernel and " at " in f" {line}":
        func = _FUNCTION.search(line.split(" and ")[0])
        if func and not func["func"].startswith("0x"):
            record.kernel = func["func"].strip()


def kernel_source(path: str, workdir: Path, build_dir: Path | None = None) -> str | None:
    """`path` (as the build named it: `../../../kernels/x.cu`, absolute, or relative to the workdir) as the
    workdir-relative path of one of the workdir's sources, else None (torch's, cuBLAS's or the toolkit's headers)."""
    root = Path(workdir).resolve()
    candidates = [Path(path)] if os.path.isabs(path) else [
        *([Path(build_dir) / path] if build_dir else []), root / path]
    for candidate in candidates:
        try:
            resolved = candidate.resolve()
        except OSError:
            continue
        inside = resolved != root and root in resolved.parents and "build" != resolved.relative_to(root).parts[0]
        if inside and resolved.is_file():
            return resolved.relative_to(root).as_posix()
    parts = Path(os.path.normpath(path)).parts
    if "kernels" in parts:  # the build folder moved since: the path from kernels/ on
        tail = Path(*parts[len(parts) - 1 - parts[::-1].index("kernels"):])
        if (root / tail).is_file():
            return tail.as_posix()
    if len(parts) == 1:  # a bare file name (how some builds record it): the workdir's one file of that name
        named = sorted(p for p in root.rglob(parts[0]) if p.is_file() and "build" != p.relative_to(root).parts[0])
        if len(named) == 1:
            return named[0].relative_to(root).as_posix()
    return None


def read(tool: str, text: str, workdir: Path, build_dir: Path | None = None) -> Report:
    """The findings of one tool's log in `workdir`'s sources (one per message and place), other records as notes."""
    found, count, loose = records(text)
    report = Report(summary_errors=count, records=len(found))
    grouped: dict[tuple[str, str], Finding] = {}
    for record in found:
        places = [f"{src}:{line}" for src, line in
                  ((kernel_source(f, workdir, build_dir), n) for f, n in record.locations) if src]
        if not places:
            where = f" at {record.locations[0][0]}:{record.locations[0][1]}" if record.locations else ""
            report.notes.append(f"{tool}: {record.headline}{where}" + (f" in {record.kernel}" if record.kernel else "")
                                + " (not in the workdir's kernels: not judged)")
            continue
        where = " and ".join(dict.fromkeys(places))
        key = (record.headline, where)
        if key in grouped:
            grouped[key].count += 1
            continue
        details = [d for d in record.details if not _LOCATION.search(d) or d.startswith("and ")]
        grouped[key] = Finding(tool, record.headline, where, record.kernel, details[:4])
    report.findings = list(grouped.values())
    report.notes += [f"{tool}: {line}" for line in loose if not line.startswith("Target application returned")]
    return report
