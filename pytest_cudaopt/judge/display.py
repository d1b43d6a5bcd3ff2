"""What a person watching `cudaopt judge` sees: a progress line while it runs and a table at the end."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence, TextIO

from pytest_cudaopt.judge.lines import table_rows


def clipped(text: str, width: int = 100) -> str:
    """`text` cut to at most `width` characters at a word boundary, with "..." where it was cut."""
    if len(text) <= width:
        return text
    cut = text[:width - 3]
    if text[width - 3] != " " and " " in cut:  # a word cut in two: left out
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:(") + "..."


class Progress:
    """A bar on a terminal (rewritten in place), else one line per finished workdir."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30):
        self.total, self.width = total, width
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.passed = 0
        self.running: dict[tuple[int, str], str | None] = {}
        self.start = time.monotonic()

    def event(self, kind: str, job, task, result=None) -> None:
        if kind == "start":
            self.running[(task.job, task.stage)] = task.device
        else:
            self.running.pop((task.job, task.stage), None)
        self._draw()

    def line(self, line: dict) -> None:
        self.done += 1
        self.passed += bool(line["passed"])
        if not self.tty:
            verdict = "PASS" if line["passed"] else "FAIL"
            why = f" ({clipped(line['reason'].splitlines()[0])})" if line.get("reason") and not line["passed"] else ""
            self.stream.write(f"cudaopt judge: {self.done}/{self.total} {line['workdir']}: {line['status']} "
                              f"{verdict}{why} {line['seconds'].get('total', 0):.1f} s\n")
            self.stream.flush()
        self._draw()

    def _draw(self) -> None:
        if not self.tty:
            return
        filled = int(self.width * self.done / max(1, self.total))
        stages = Counter(stage for _, stage in self.running)
        doing = ", ".join(f"{n} {s}" for s, n in sorted(stages.items())) or "idle"
        self.stream.write(f"\r\033[Kcudaopt judge [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                          f"({self.passed} passed) {doing}, {time.monotonic() - self.start:.0f} s")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def summary(lines: Sequence[dict], *, wall_s: float, busy: dict[str, float], root: Path | None = None) -> str:
    """The final table and its notes: throughput, each device's busy fraction, time by stage, the caches."""
    from pytest_cudaopt.results.report import render_rows  # imports torch: only once there is a table to show

    passed = sum(1 for line in lines if line["passed"])
    judged = sum(1 for line in lines if line["status"] not in ("error", "cancelled"))
    rate = (f"{judged * 3600 / wall_s:.0f} workdirs per hour" if judged and wall_s >= 0.1 else
            "nothing judged" if not judged else "too quick for a rate")
    notes = [f"{len(lines)} workdirs in {wall_s:.1f} s: {passed} passed; {rate}"]
    if busy:
        notes.append("busy: " + ", ".join(f"{name} {fraction:.0%}" for name, fraction in busy.items()))
    spent: Counter = Counter()
    for line in lines:
        spent.update(line.get("time", {}))
    if any(spent.values()):
        notes.append("time by stage (summed over workdirs): " + ", ".join(f"{k} {v:.1f} s" for k, v in spent.items()))
    cached = sum(line.get("objects", {}).get("cached", 0) for line in lines)
    compiled = sum(line.get("objects", {}).get("compiled", 0) for line in lines)
    if cached or compiled:
        notes.append(f"objects: {cached} from the cache, {compiled} compiled")
    statuses = Counter(line["status"] for line in lines)
    notes.append("status: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    return render_rows(table_rows(lines, root), title="cudaopt judge", notes=notes)
