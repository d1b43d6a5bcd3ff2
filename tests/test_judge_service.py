"""The judge as a warm service: workdirs submitted as they come (a folder, tar bytes) each resolve to one line with its verdict, its id and its queue and judging time; a child killed mid-judging and a workdir past its backstop each get their line while the service goes on; close drains, stop cancels, nothing lost or counted twice; `cudaopt judge --serve` on stdin and stdout."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_cudaopt.judge import Options, Service, copies, runner, stages
from pytest_cudaopt.judge.devices import cpu_slots
from pytest_cudaopt.judge.stdio import READY
from pytest_cudaopt.run import turn as turns
from support import JUDGE_CACHE, JUDGE_CPU_ARGS, judge_workdirs, subprocess_env

TIMEOUT_S = 120   # each child's limit: far past the moment the test kills the hang's check


def _check_child(out: Path) -> int | None:
    """The pid of the stage child that runs in `out` (the session leader there), if any."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(entry.name)
            if Path(os.readlink(entry / "cwd")) == out and os.getsid(pid) == pid:
                return pid
        except (OSError, ValueError):
            continue
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One service over CPU workdirs: the hang's check child killed mid-judging, then an honest
    workdir (a folder) and a wrong one (tar bytes) submitted after it."""
    root = tmp_path_factory.mktemp("serve")
    made = judge_workdirs(root / "gallery", names=("honest", "wrong", "hang"))
    started: dict[str, Path] = {}
    checking = threading.Event()

    def on_event(kind, job, task, *rest):
        if kind == "start" and task.stage == "check" and job.id == "hang":
            started["out"] = job.out
            checking.set()

    options = Options(cpu_slots=2, jobs=2, timeout=TIMEOUT_S, cache_dir=JUDGE_CACHE, scratch=root / "scratch",
                      pytest_args=list(JUDGE_CPU_ARGS))
    with Service(options, on_event=on_event) as service:
        hang = service.submit(made["hang"], id="hang")
        assert checking.wait(300), "the hang's check never started"
        deadline, pid = time.monotonic() + 60, None
        while pid is None and time.monotonic() < deadline:
            pid = _check_child(started["out"])
            time.sleep(0.2)
        assert pid is not None, f"no check child runs in {started['out']}"
        time.sleep(2)   # the child is in its items
        os.kill(pid, signal.SIGKILL)
        killed = hang.result(120)
        honest = service.submit(made["honest"])
        wrong = service.submit(copies.pack(made["wrong"])[0], id="wrong-as-bytes")
        found = {"honest": honest.result(600), "wrong": wrong.result(600)}
    return {"killed": killed, **found, "made": made}


def test_a_passing_workdir_resolves_to_a_passing_line(served):
    line = served["honest"]
    assert (line["status"], line["passed"]) == ("judged", True), line["reason"]
    assert line["workdir"] == str(served["made"]["honest"]) and isinstance(line["id"], int)


def test_a_failing_workdir_sent_as_bytes_resolves_to_its_failure(served):
    line = served["wrong"]
    assert (line["status"], line["passed"], line["id"]) == ("judged", False, "wrong-as-bytes")
    assert line["verdicts"]["correctness"] == "FAIL" and line["verdicts"]["perf"] == "not run"
    assert line["workdir"] == "tar:wrong-as-bytes"


def test_each_line_splits_its_time_into_queued_and_judging(served):
    for name in ("honest", "wrong"):
        seconds = served[name]["seconds"]
        assert seconds["queued"] >= 0 and seconds["judging"] > 0
        assert seconds["total"] == pytest.approx(seconds["queued"] + seconds["judging"], abs=0.01)
        assert seconds["judging"] >= seconds["build"] + seconds["policy"] + seconds["check"] - 0.01


def test_a_child_killed_mid_judging_gets_a_line_that_says_so(served):
    line = served["killed"]
    assert (line["id"], line["status"], line["passed"]) == ("hang", "crashed", False)
    assert "SIGKILL" in line["reason"] and line["stages"]["check"]["status"] == "crashed"


# -- the service's own bookkeeping, with stages that start no pytest ---------------------------------------


def _workdir(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model.py").write_text("PROBLEM = 'scale'\n")
    (folder / "model_new.py").write_text(f"NAME = {name!r}\n")
    return folder


class Stages:
    """run_stage without pytest: every stage passes after `pause` seconds, except a workdir named
    hang*, whose check is a real child that sleeps for a minute (ended only by its children's end)."""

    def __init__(self, pause: float = 0.05, busy: int = 0):
        self.pause, self.busy = pause, busy   # busy: how many checks of a workdir named busy* find the device held
        self.sleeping = threading.Event()

    def __call__(self, stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        kind = {"policy": "policy", "check": "correctness", "perf": "perf"}.get(stage)
        if place is not None:   # as a device stage's child does before it uses its device
            turns.wait(place.folder)
        if copy.name.startswith("hang") and stage == "check":
            self.sleeping.set()
            outcome = runner.run([sys.executable, "-c", "import time; time.sleep(60)"], env=subprocess_env(),
                                 cwd=out, timeout=60, log=out / "check.log", children=children, grace=1.0)
            return stages.StageResult(stage, "crashed", outcome.seconds, reason=f"ended by {outcome.signal}")
        time.sleep(self.pause)
        cases = [{"kind": kind, "name": f"test_{stage}", "outcome": "passed", "seconds": 0.01}] if kind else []
        report = {"schema": "cudaopt-report/2", "passed": True, "complete": True, "items": [], "results": []}
        if copy.name.startswith("busy") and stage == "check" and self.busy > 0:   # the device held by others
            self.busy -= 1
            report = {**report, "passed": False, "complete": False, "blame": "environment", "cause": "environment"}
            return stages.StageResult(stage, "failed", self.pause, report=report, reason="device busy", cases=cases)
        return stages.StageResult(stage, stages.OK, self.pause, report=report if kind else None, cases=cases)


def _service(fake: Stages, slots: int = 2, **options) -> Service:
    return Service(Options(cache_dir=None, pytest_args=["--cudaopt-device=cpu"], jobs=slots, **options),
                   devices=cpu_slots(slots), run_stage=fake)


def test_a_workdir_past_its_backstop_gets_a_timeout_line_and_the_service_goes_on(tmp_path):
    fake = Stages()
    service = _service(fake, backstop=2.0)
    started = time.monotonic()
    hung = service.submit(_workdir(tmp_path, "hang"), id="h")
    line = hung.result(30)
    assert (line["id"], line["status"], line["passed"]) == ("h", "timeout", False)
    assert "backstop of 2 s" in line["reason"] and 2.0 <= line["seconds"]["judging"] < 10
    after = service.submit(_workdir(tmp_path, "after")).result(30)
    assert (after["status"], after["passed"]) == ("judged", True)
    service.close()
    assert time.monotonic() - started < 30   # the sleeping child was ended, not waited for
    assert service.in_flight == 0


def test_the_default_backstop_outlasts_every_stage_at_its_limit():
    options = Options(timeout=100.0, build_timeout=300.0)
    # the build; policy; a check and its retry alone; a perf stage whose wait for its turn adds its limit again
    longest = options.build_timeout + options.grace + 2 * (options.timeout + options.grace) + \
        (2 * options.timeout + options.grace) + options.timeout + options.grace
    assert options.backstop_s > longest


@pytest.mark.parametrize("busy, retries, status, attempts", [(2, 2, "judged", 3), (3, 2, "failed", 3),
                                                               (1, 0, "failed", 1)])
def test_a_workdir_the_environment_failed_is_judged_again_and_counted_once(tmp_path, busy, retries, status,
                                                                          attempts):
    service = _service(Stages(busy=busy), environment_retries=retries)
    line = service.submit(_workdir(tmp_path, "busy")).result(30)
    service.close()
    assert line["attempts"] == attempts and line["passed"] == (status == "judged"), line
    assert line["blame"] == (None if status == "judged" else "environment"), line
    # why it went again is kept: each earlier attempt's status, blame and reason, and its seconds (for a replay)
    earlier = line.get("earlier", [])
    assert [{k: e[k] for k in ("status", "blame", "reason")} for e in earlier] == [
        {"status": "judged", "blame": "environment", "reason": "check: device busy"}] * (attempts - 1), line
    assert all(set(e["seconds"]) >= {"build", "policy", "check", "total"} and "perf" not in e["seconds"]
               for e in earlier), earlier
    assert service.in_flight == 0


def test_cudaopt_judge_judges_a_workdir_the_environment_failed_again_in_the_same_pool_ahead_of_the_queue(
        tmp_path, monkeypatch):
    """`cudaopt judge` (Judge) as a Service does: the second attempt goes back into the running pool, before the
    workdirs still queued, not into a second pass after them all; one line each, `attempts` counted."""
    from pytest_cudaopt.judge import engine, pool as pool_module

    made: list = []

    class Pool(pool_module.LocalPool):
        def __init__(self, workdirs, options, on_event=None):
            super().__init__(workdirs, options, devices=cpu_slots(1), on_event=on_event, run_stage=Stages(busy=1))
            made.append(self)

    monkeypatch.setattr(pool_module, "LocalPool", Pool)
    names = ["busy", "a", "b", "c", "d"]
    for name in names:
        _workdir(tmp_path, name)
    judge = engine.Judge([str(tmp_path / n) for n in names],
                         Options(cache_dir=None, pytest_args=["--cudaopt-device=cpu"], jobs=1))
    lines = list(judge)
    assert len(made) == 1, "a second pool judged the retry"
    assert sorted(Path(line["workdir"]).name for line in lines) == sorted(names)
    busy = next(line for line in lines if line["workdir"].endswith("busy"))
    assert busy["attempts"] == 2 and busy["passed"] and busy["id"] == 0, busy
    assert [e["blame"] for e in busy["earlier"]] == ["environment"], busy
    assert {line["attempts"] for line in lines if line is not busy} == {1}
    assert not any("earlier" in line for line in lines if line is not busy)
    assert [Path(line["workdir"]).name for line in lines][-1] != "busy", "the retry waited behind the queue"


def test_close_drains_every_submission_to_exactly_one_line(tmp_path):
    fake = Stages(pause=0.1)
    service = _service(fake)
    futures = [service.submit(_workdir(tmp_path, f"w{n}")) for n in range(6)]
    service.close()
    assert all(f.done() for f in futures)
    found = [f.result() for f in futures]
    assert [line["id"] for line in found] == list(range(6))
    assert {(line["status"], line["passed"]) for line in found} == {("judged", True)}
    late = service.submit(_workdir(tmp_path, "late")).result(5)
    assert late["status"] == "cancelled" and "after the service was closed" in late["reason"]


def test_stop_cancels_what_is_queued_and_ends_what_runs(tmp_path):
    fake = Stages()
    service = _service(fake, slots=1)
    futures = [service.submit(_workdir(tmp_path, "hang"), id="running")]
    futures += [service.submit(_workdir(tmp_path, f"q{n}"), id=f"q{n}") for n in range(3)]
    assert fake.sleeping.wait(30)
    started = time.monotonic()
    service.stop()
    assert time.monotonic() - started < 20   # the running child was ended
    found = {f.result(0)["id"]: f.result(0) for f in futures}
    assert sorted(found) == ["q0", "q1", "q2", "running"]
    assert {line["status"] for line in found.values()} == {"cancelled"}
    assert "while this workdir was judged" in found["running"]["reason"]
    assert "before this workdir's judging began" in found["q2"]["reason"]
    assert found["q2"]["seconds"]["judging"] == 0
    assert service.submit(_workdir(tmp_path, "late")).result(5)["status"] == "cancelled"


def test_an_id_still_in_flight_is_refused(tmp_path):
    service = _service(Stages(pause=0.2))
    try:
        service.submit(_workdir(tmp_path, "a"), id="same")
        with pytest.raises(ValueError, match="'same' is still in flight"):
            service.submit(_workdir(tmp_path, "b"), id="same")
    finally:
        service.close()


def test_what_is_no_workdir_gets_an_error_line(tmp_path):
    with _service(Stages()) as service:
        line = service.submit(tmp_path).result(5)
    assert line["status"] == "error" and "is not a workdir" in line["reason"]


# -- cudaopt judge --serve ----------------------------------------------------------------------------------


def _serve(*args: str, cwd: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "pytest_cudaopt.cli", "judge", "--serve", "--cpu-slots", "2", "--jobs", "2",
               "--timeout", str(TIMEOUT_S), "--cache-dir", str(JUDGE_CACHE), *args, "--", *JUDGE_CPU_ARGS]
    return subprocess.Popen(command, cwd=cwd, env=subprocess_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_serve_on_stdio_writes_a_line_for_each_line_read_then_exits_at_the_end_of_input(tmp_path):
    made = judge_workdirs(tmp_path / "gallery", names=("wrong",))
    proc = _serve(cwd=tmp_path)
    feed = f"{made['wrong']}\n" + json.dumps({"path": str(tmp_path / "nothing"), "id": "missing"}) + "\n"
    out, err = proc.communicate(feed, timeout=600)
    found = [json.loads(raw) for raw in out.splitlines()]
    assert len(found) == 2, err[-3000:]
    by_id = {line["id"]: line for line in found}
    assert (by_id[0]["status"], by_id[0]["passed"], by_id[0]["verdicts"]["correctness"]) == ("judged", False, "FAIL")
    assert by_id["missing"]["status"] == "error" and "no such file or folder" in by_id["missing"]["reason"]
    assert proc.returncode == 3, err[-3000:]   # one could not be judged


def test_serve_on_stdio_cancels_what_is_queued_at_sigterm(tmp_path):
    made = judge_workdirs(tmp_path / "gallery", names=("honest", "wrong", "hang"))
    proc = _serve(cwd=tmp_path)
    for n, path in enumerate(made.values()):
        proc.stdin.write(json.dumps({"path": str(path), "id": f"w{n}"}) + "\n")
    proc.stdin.flush()
    for said in iter(proc.stderr.readline, ""):   # its start may take long on a loaded machine
        if said.startswith(READY):
            break
    time.sleep(2)   # the lines read and queued
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    found = [json.loads(raw) for raw in out.splitlines()]
    assert sorted(line["id"] for line in found) == ["w0", "w1", "w2"], err[-3000:]
    assert {line["status"] for line in found} == {"cancelled"}, err[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM


def test_serve_answers_a_request_it_cannot_read_with_an_error_line(tmp_path):
    from pytest_cudaopt.judge.stdio import serve

    stdin = io.StringIO('{"path": 3}\n{broken\n\n' + f"{tmp_path / 'nowhere'}\n")
    stdout = io.StringIO()
    code = serve(Options(cache_dir=None, pytest_args=["--cudaopt-device=cpu"]), stdin, stdout)
    found = [json.loads(raw) for raw in stdout.getvalue().splitlines()]
    assert [line["status"] for line in found] == ["error"] * 3 and code == 3
    assert '"path", a string' in found[0]["reason"] and "not JSON" in found[1]["reason"]
    assert "no such file or folder" in found[2]["reason"]
