"""sentinel.py on its own: pytest's JUnit names, the outcomes it keeps, and when it writes."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest
from _pytest.junitxml import mangle_test_address  # the reference for junit_names

from pytest_cudaopt.run import sentinel

HUNG = "wd/model_new.py::TestCorrectness::test_canonical[seed0]"
ITEMS = ["wd/model_new.py::TestPolicy::test_rule[MN001]", "wd/model_new.py::TestPolicy::test_rule[MN002]",
         "wd/model_new.py::TestCorrectness::test_extension_functions", HUNG,
         "wd/model_new.py::TestCorrectness::test_drawn_shapes"]


@pytest.mark.parametrize("nodeid", [*ITEMS, "tests/test_x.py::test_y[a::b/c.py]", "top.py::test_z"])
def test_junit_names_are_pytests(nodeid):
    names = mangle_test_address(nodeid)
    assert sentinel.junit_names(nodeid) == {"nodeid": nodeid, "classname": ".".join(names[:-1]), "name": names[-1]}
    assert sentinel.junit_names(nodeid, "pre")["classname"] == "pre." + ".".join(names[:-1])


def _messages(junit: str) -> list[dict]:
    ok = {"outcome": "passed", "text": "", "duration": 0.1}
    return [
        {"items": [sentinel.junit_names(n) for n in ITEMS], "junit": junit, "suite": "suite"},
        {"start": ITEMS[0]}, *({"report": ITEMS[0], "when": w, **ok} for w in ("setup", "call", "teardown")),
        {"start": ITEMS[1]}, {"report": ITEMS[1], "when": "setup", **ok},
        {"report": ITEMS[1], "when": "call", "outcome": "failed", "text": "Traceback\nKC001: torch op", "duration": 0.2},
        {"report": ITEMS[1], "when": "teardown", **ok},
        {"start": ITEMS[2]},
        {"report": ITEMS[2], "when": "setup", "outcome": "skipped", "text": "needs the built extension", "duration": 0},
        {"report": ITEMS[2], "when": "teardown", **ok},
        {"start": HUNG}, {"report": HUNG, "when": "setup", **ok},
    ]


def test_the_run_ends_with_the_running_item_failed_and_the_rest_not_run(tmp_path):
    run = sentinel.Run()
    for message in _messages(str(tmp_path / "j.xml")):
        run.apply(message)
    outcomes = {item["nodeid"]: outcome for item, outcome in run.end("CRASH: it died")}
    assert [outcomes[n].kind for n in ITEMS] == ["passed", "failed", "skipped", "failed", "skipped"]
    assert outcomes[ITEMS[1]].message == "KC001: torch op"
    assert outcomes[ITEMS[2]].message == "needs the built extension"
    assert outcomes[HUNG].message == "CRASH: it died"
    assert outcomes[ITEMS[4]].message == f"not run: the pytest process ended while {HUNG} ran"


def _fake_parent(seconds: float = 60) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def _watch(messages: list[dict], close: bool, parent: int, timeout: float = 30) -> int:
    read, write = os.pipe()
    with os.fdopen(write, "wb") as stream:
        for message in messages:
            stream.write((json.dumps(message) + "\n").encode())
        stream.flush()
        if not close:
            result = {}
            thread = threading.Thread(target=lambda: result.update(rc=sentinel.watch(parent, os.fdopen(read, "rb"))))
            thread.start()
            thread.join(timeout)
            assert not thread.is_alive(), "the sentinel did not end by its backstop"
            return result["rc"]
    with os.fdopen(read, "rb") as stream:
        return sentinel.watch(parent, stream)


def test_done_ends_the_sentinel_without_a_word(tmp_path, capsys):
    junit = tmp_path / "j.xml"
    assert _watch([*_messages(str(junit)), {"done": True}], close=True, parent=os.getpid()) == 0
    assert not junit.exists() and capsys.readouterr().err == ""


def test_a_closed_pipe_writes_the_junit_file_and_the_summary(tmp_path, capsys):
    junit = tmp_path / "j.xml"
    assert _watch(_messages(str(junit)), close=True, parent=os.getpid()) == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("name"), suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("suite", "5", "2", "2")
    [hung] = [case for case in suite.iter("testcase") if case.get("name") == "test_canonical[seed0]"]
    assert hung.get("classname") == "wd.model_new.TestCorrectness"
    assert hung.find("failure").get("message").startswith("CRASH: the pytest process ended while this test ran")
    err = capsys.readouterr().err
    assert f"  FAILED {HUNG}: CRASH" in err and "  FAILED wd/model_new.py::TestPolicy::test_rule[MN002]: KC001" in err
    assert "cudaopt: 2 failed, 1 passed, 2 skipped (1 of the skipped not run)" in err
    assert f"JUnit file written to {junit} by the sentinel" in err


def test_a_backstop_that_passes_writes_then_aborts_a_process_that_lives_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sentinel, "KILL_AFTER_S", 0.5)
    parent = _fake_parent()
    junit = tmp_path / "j.xml"
    started = time.monotonic()
    rc = _watch([*_messages(str(junit)), {"backstop": 0.5, "why": "ran longer than cudaopt_timeout=1s"}],
                close=False, parent=parent.pid)
    assert rc == 1 and time.monotonic() - started >= 1.0
    assert parent.wait(10) == -signal.SIGABRT
    assert "TIMEOUT: ran longer than cudaopt_timeout=1s: a C/C++ loop that holds the GIL" in junit.read_text()
    assert f"ending pytest (pid {parent.pid}) with SIGABRT" in capsys.readouterr().err


def test_a_cleared_backstop_never_fires(tmp_path, capsys):
    parent = _fake_parent(2)
    messages = [*_messages(str(tmp_path / "j.xml")), {"backstop": 0.2, "why": "x"}, {"backstop": None, "why": ""}]
    read, write = os.pipe()
    with os.fdopen(write, "wb") as stream:
        stream.write("".join(json.dumps(m) + "\n" for m in messages).encode())
        stream.flush()
        time.sleep(1.0)  # past the cleared backstop
        stream.write(b'{"done": true}\n')
    with os.fdopen(read, "rb") as stream:
        assert sentinel.watch(parent.pid, stream) == 0
    assert parent.wait(10) == 0 and capsys.readouterr().err == ""


def test_the_crash_names_the_running_items_case_and_replay_command(tmp_path, capsys):
    junit = tmp_path / "j.xml"
    case = {"case": "drawn shape features=65, seed 7", "replay": f"pytest '{HUNG}' --cudaopt-case=features=65"}
    assert _watch([*_messages(str(junit)), case], close=True, parent=os.getpid()) == 1
    [hung] = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "test_canonical[seed0]"]
    failure = hung.find("failure")
    assert failure.get("message").endswith("(case: drawn shape features=65, seed 7)")
    assert "\ncase: drawn shape features=65, seed 7\nreplay: pytest " in failure.text
    assert f"    replay: pytest '{HUNG}' --cudaopt-case=features=65" in capsys.readouterr().err


def _early_report(path, running):
    """A JSON report as the plugin writes it before `running` (cause "running")."""
    items = [{"test": n, "kind": "policy" if "Policy" in n else "correctness", "workdir": "/wd",
              "status": "passed" if n == ITEMS[0] else "not run", "reason": ""} for n in ITEMS]
    path.write_text(json.dumps({"schema": "cudaopt-report/2", "passed": False, "complete": False,
                                "cause": "running", "running": running, "items": items, "not_passed": []}))


def test_the_crash_amends_the_report_written_before_the_item(tmp_path):
    report = tmp_path / "r.json"
    _early_report(report, HUNG)
    messages = _messages(str(tmp_path / "j.xml"))
    messages[0]["report"] = str(report)
    assert _watch([*messages, {"case": "canonical seed0", "replay": "pytest x"}], close=True, parent=os.getpid()) == 1
    doc = json.loads(report.read_text())
    assert (doc["passed"], doc["complete"], doc["cause"]) == (False, False, "crash")
    assert doc["reason"].startswith("CRASH: the pytest process ended") and "; case: canonical seed0" in doc["reason"]
    status = {item["test"]: (item["status"], item["reason"]) for item in doc["items"]}
    assert status[HUNG][0] == "failed" and "replay: pytest x" in status[HUNG][1]
    assert status[ITEMS[1]] == ("failed", "KC001: torch op")  # ended after the report was written
    assert status[ITEMS[4]] == ("not run", f"not run: the pytest process ended while {HUNG} ran")
    assert doc["not_passed"][0].startswith("the session did not complete: CRASH")
    assert doc["counts"] == {"passed": 1, "failed": 2, "skipped": 1, "not run": 1}


def test_a_final_report_is_never_amended(tmp_path):
    report = tmp_path / "r.json"
    final = {"schema": "cudaopt-report/2", "passed": True, "complete": True, "cause": None, "items": []}
    report.write_text(json.dumps(final))
    messages = _messages(str(tmp_path / "j.xml"))
    messages[0]["report"] = str(report)
    assert _watch(messages, close=True, parent=os.getpid()) == 1
    assert json.loads(report.read_text()) == final


def test_a_sigterm_leaves_pytest_its_grace_then_the_sentinel_writes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sentinel, "TERM_GRACE_S", 0.5)
    monkeypatch.setattr(sentinel, "_terminated_at", [time.monotonic()])
    junit = tmp_path / "j.xml"
    assert _watch(_messages(str(junit)), close=False, parent=os.getpid()) == 1
    assert "TERMINATED: SIGTERM, and pytest had not ended its session 0.5 s later" in junit.read_text()
