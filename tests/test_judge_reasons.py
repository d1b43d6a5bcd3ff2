"""What `cudaopt judge` says a workdir failed for: the item and its reason in the line, a progress line cut at a word."""

from __future__ import annotations

import io
import json
from pathlib import Path

from pytest_cudaopt.judge import stages
from pytest_cudaopt.judge import display
from pytest_cudaopt.judge.runner import Outcome

GATE = "speedup 0.085x is below the required 1.05x"
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="wd.model_new.TestPerf" name="test_speedup" time="3.1"><failure message="x">x</failure></testcase>
</testsuite></testsuites>
"""


def test_a_failed_perf_stage_says_the_gates_reason(tmp_path: Path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    report = {"schema": "cudaopt-report/2", "passed": False, "complete": True, "results": [],
              "items": [{"test": "model_new.py::TestPerf::test_speedup", "kind": "perf", "status": "failed",
                         "reason": GATE}]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    outcome = Outcome(returncode=1, timed_out=False, seconds=3.0, tail="", log=tmp_path / "log")
    read = stages.read_pytest("perf", outcome, tmp_path / "report.json", tmp_path / "junit.xml")
    assert (read.status, read.reason) == ("failed", f"failed: perf test_speedup ({GATE})")


def test_the_progress_line_cuts_a_long_reason_at_a_word_with_an_ellipsis():
    reason = "check: failed: correctness test_drawn_shapes (model_new.py: ModelNew's output differs from Model's"
    reason += " (model.py)), correctness test_canonical[seed1]"
    stream = io.StringIO()
    display.Progress(1, stream=stream).line({"workdir": "wd", "status": "judged", "passed": False, "reason": reason,
                                     "seconds": {"total": 4.0}})
    shown = stream.getvalue().split(" (", 1)[1].rsplit(") ", 1)[0]
    assert shown.endswith("...") and len(shown) <= 100 and reason.startswith(shown[:-3])
    assert reason[len(shown) - 3] == " ", shown  # the cut is at the end of a word
    assert display.clipped("short reason") == "short reason"
    assert display.clipped("a" * 150) == "a" * 97 + "..."
