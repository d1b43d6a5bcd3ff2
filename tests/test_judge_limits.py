"""The judge where something runs short: a check out of device memory beside others (judged again alone), a model.py that never finishes importing (one timeout), no Ray cluster, no device, the judge's own failure (a line per workdir, exit 3)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pytest_cudaopt.judge import Judge, Options, lines as judge_lines, pool, runner, stages
from pytest_cudaopt.judge.devices import DeviceSet, cpu_slots
from pytest_cudaopt.run import turn as turns
from pytest_cudaopt.run.scratch import own_folder
from pytest_cudaopt.judge.display import summary
from support import JUDGE_CACHE, subprocess_env

GiB = 1 << 30
SHORT = ("drawn shape batch_size=2095, dim=786431 (inputs 6.14 GiB, outputs 6.14 GiB) needs about 32.69 GiB of "
         "device memory, only 28.19 GiB is free; lower --cudaopt-max-elements (cudaopt_max_elements) to draw smaller "
         "shapes")


def _workdir(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model.py").write_text("PROBLEM = 'softmax'\n")   # one problem: one model.py
    (folder / "model_new.py").write_text(f"NAME = {name!r}\n")
    return folder


def _report(passed: bool, check: str = "", message: str = "", peak: int = GiB) -> dict:
    data = {"check": check, "message": message, "peak_bytes": peak}
    return {"schema": "cudaopt-report/2", "passed": passed, "complete": True, "items": [],
            "results": [{"kind": "correctness", "passed": passed, "data": data}]}


def _stage(stage: str, status: str = stages.OK, report: dict | None = None) -> stages.StageResult:
    kind = {"policy": "policy", "check": "correctness", "perf": "perf"}.get(stage)
    outcome = "passed" if status == stages.OK else "failure"
    cases = [{"kind": kind, "name": f"test_{stage}", "outcome": outcome, "seconds": 0.1}] if kind else []
    if report is None and kind:
        report = {"schema": "cudaopt-report/2", "passed": status == stages.OK, "complete": True, "items": [],
                  "results": []}
    return stages.StageResult(stage, status, 0.1, report=report, cases=cases)


def _loading_out_of_memory() -> stages.StageResult:
    """A check whose first item could not load the workdir (CUDA out of memory), the rest not run after it."""
    items = [{"test": "model_new.py::TestCorrectness::test_canonical[seed0]", "kind": "correctness",
              "status": "failed", "reason": "AcceleratorError: CUDA error: out of memory", "blame": "candidate"},
             {"test": "model_new.py::TestMemorySafety::test_memory_safety", "kind": "memsafety", "status": "not run",
              "reason": "not run: loading the workdir failed", "blame": "candidate"}]
    report = {"schema": "cudaopt-report/2", "passed": False, "complete": True, "items": items, "results": []}
    result = _stage("check", stages.FAILED, report)
    result.cases.append({"kind": "memsafety", "name": "test_memory_safety", "outcome": "failure", "seconds": 0.0})
    return result


WRONG = "output 0 differs from the reference beyond tolerance"


def _environment_shortfall(out: Path, wrong: bool = False) -> stages.StageResult:
    """A check whose child found too little device memory free while others held it, as it reports that: the
    SHORTFALL blamed on the environment, the session ended there (not complete), exit 75; read as the judge does.
    `wrong`: an item before it failed for the candidate's own sake (its outputs differ)."""
    test = "model_new.py::TestCorrectness::test_canonical[seed0]"
    out.mkdir(parents=True, exist_ok=True)
    report = {**_report(False, "memory", SHORT), "complete": False, "cause": "environment", "blame": "environment",
              "reason": f"{test} failed for the environment's sake, not the candidate's: {SHORT}",
              "items": [{"test": test, "kind": "correctness", "status": "failed", "reason": SHORT,
                         "blame": "environment"}]}
    report["results"][0]["data"]["blame"] = "environment"
    if wrong:
        report["items"].insert(0, {"test": "model_new.py::TestCorrectness::test_drawn[0]", "kind": "correctness",
                                   "status": "failed", "reason": WRONG, "blame": "candidate"})
        report["results"].insert(0, _report(False, "values", WRONG)["results"][0])
    (out / "check.json").write_text(json.dumps(report))
    (out / "check.xml").write_text('<testsuites><testsuite><testcase classname="model_new.TestCorrectness" '
                                   'name="test_canonical[seed0]"><failure message="short"/></testcase></testsuite>'
                                   '</testsuites>')
    outcome = runner.Outcome(75, False, 0.1, "", out / "check.log")
    return stages.read_pytest("check", outcome, out / "check.json", out / "check.xml")


class FakeStages:
    """run_stage without processes: every stage passes, except that the named workdirs' checks
    run out of device memory (`short`: how many times each), and `overlap` checks wait until
    they have all started, so that they share the device."""

    def __init__(self, short: dict[str, int], overlap: int = 1, at_load: bool = False, blamed: bool = False,
                 wrong: frozenset[str] = frozenset(), slow: frozenset[str] = frozenset()):
        self.short, self.calls, self.at_load = dict(short), [], at_load   # at_load: CUDA's error loading the workdir
        self.blamed = blamed   # the shortfall as the child reports it when others hold the memory
        self.wrong = wrong     # workdirs whose outputs differ: their checks fail for themselves too
        self.slow = slow       # workdirs whose checks last until another's check has run again (beside them)
        self.running: set[str] = set()
        self.lock = threading.Lock()
        self.together = threading.Barrier(overlap, timeout=20)

    def __call__(self, stage, copy, out, devices, device, options, children=None, turn=None, place=None, pause=None):
        name = copy.name
        if stage != "check":
            return _stage(stage)
        turns.wait(place.folder)   # as the check's child does before it uses its device
        with self.lock:
            first = not any(c[0] == name for c in self.calls)
            self.calls.append((name, device, set(self.running)))
            self.running.add(name)
        try:
            if first:
                self.together.wait()
            deadline = time.monotonic() + 20
            while name in self.slow and time.monotonic() < deadline and not any(
                    [c[0] for c in self.calls].count(other) > 1 for other in self.short):
                time.sleep(0.01)
            if self.short.get(name, 0) > 0:
                self.short[name] -= 1
                if pause is not None:   # paused for a turn in the attempt judged again, not in the last
                    pause.total = 0.25
                if self.at_load:
                    return _loading_out_of_memory()
                if self.blamed:
                    return _environment_shortfall(out, wrong=name in self.wrong)
                return _stage("check", stages.FAILED, _report(False, "memory", SHORT))
            if name in self.wrong:
                return _stage("check", stages.FAILED, _report(False, "values", WRONG))
            return _stage("check", report=_report(True, peak=30 * GiB))
        finally:
            time.sleep(0.05)
            with self.lock:
                self.running.discard(name)


def _pool_lines(monkeypatch, tmp_path, fake: FakeStages, names, share: int = 2) -> dict[str, dict]:
    monkeypatch.setattr(pool, "run_stage", fake)
    workdirs = [_workdir(tmp_path / "w", n) for n in names]
    options = Options(gpus=["0"], jobs=2, share=share, cache_dir=None, fork=False, scratch=tmp_path / "scratch")
    found = pool.LocalPool(workdirs, options, DeviceSet(["0"], memory={"0": 80 * GiB})).lines()
    return {Path(line["workdir"]).name: line for line in found}


def test_a_check_out_of_memory_beside_another_is_judged_again_alone_never_failed(monkeypatch, tmp_path):
    fake = FakeStages({"a": 1}, overlap=2)
    found = _pool_lines(monkeypatch, tmp_path, fake, ["a", "b"])
    assert (found["a"]["status"], found["a"]["passed"]) == ("judged", True), found["a"]["reason"]
    assert found["b"]["passed"]
    runs = [(device, beside) for name, device, beside in fake.calls if name == "a"]
    assert len(runs) == 2 and runs[1] == ("0", set())      # the second run had the GPU to itself
    note = found["a"]["stages"]["check"]["note"]
    assert "ran out of device memory on 0 beside other checks" in note and "32.69 GiB" in note
    assert "judged again alone" in note


def test_a_check_the_environment_starved_beside_another_is_judged_again_alone_not_the_whole_workdir(
        monkeypatch, tmp_path):
    """The shortfall as a real child reports it (blamed on the environment, exit 75: the stage an `error`). On an
    H100 a memory hog's neighbours went round again as whole workdirs, back among the hogs, up to three times."""
    result = _environment_shortfall(tmp_path / "read")
    assert result.status == "error" and stages.shortfall(result) == SHORT
    fake = FakeStages({"a": 1}, overlap=2, blamed=True)
    found = _pool_lines(monkeypatch, tmp_path, fake, ["a", "b"])
    assert (found["a"]["status"], found["a"]["passed"]) == ("judged", True), found["a"]["reason"]
    runs = [(device, beside) for name, device, beside in fake.calls if name == "a"]
    assert len(runs) == 2 and runs[1] == ("0", set())      # the second run had the GPU to itself
    assert "beside other checks" in found["a"]["stages"]["check"]["note"]
    alone = _pool_lines(monkeypatch, tmp_path / "alone", FakeStages({"a": 1}, blamed=True), ["a"])["a"]
    assert (alone["status"], alone["blame"]) == ("error", "environment"), alone   # not called the workdir's
    assert "the shortfall is this workdir's" not in alone["reason"], alone["reason"]


def test_a_wrong_check_the_environment_starved_beside_another_is_judged_again_and_fails_as_its_own(
        monkeypatch, tmp_path):
    """A check that fails for itself and also ran short beside a memory hog: its child blames the environment (exit
    75), as no shortfall of its own decides it. Only its check is judged again, placed as any check is (the whole
    workdir went back to the queue on an H100: build and policy again), where it fails as `pytest` alone fails it;
    kept from its verdict a second time, it is judged alone."""
    result = _environment_shortfall(tmp_path / "read", wrong=True)
    assert result.status == "error" and stages.shortfall(result) is None   # not a shortfall alone
    for times in (1, 2):
        fake = FakeStages({"a": times}, overlap=2, blamed=True, wrong=frozenset({"a"}), slow=frozenset({"b"}))
        found = _pool_lines(monkeypatch, tmp_path / str(times), fake, ["a", "b"])
        line = found["a"]
        assert (line["status"], line["passed"], line["blame"]) == ("judged", False, "candidate"), line
        assert line["stages"]["check"]["status"] == "failed" and found["b"]["passed"]
        assert [c[0] for c in fake.calls].count("a") == times + 1 and [c[0] for c in fake.calls].count("b") == 1
        note = line["stages"]["check"]["note"]
        kept = "was kept from a verdict beside other stages on 0 (not the candidate's fault but the environment's"
        assert note.startswith(kept) and "; judged again" in note, note
        assert ("alone" in note) == (times == 2), note
        again = {k: v for k, v in line["seconds"].items() if "_again" in k}   # the attempts a replay replays
        assert set(again) == ({"check_again", "check_again_alone"} if times == 2 else {"check_again"}), again
        assert line["seconds"]["check"] > sum(again.values()) > 0
    assert "; judged again; then it " + kept in note and note.endswith("judged again alone on an idle device")
    runs = [(device, beside) for name, device, beside in fake.calls if name == "a"]
    assert runs[1] == ("0", {"b"}) and runs[2] == ("0", set())   # again beside b, then with the GPU to itself
    alone = _pool_lines(monkeypatch, tmp_path / "alone", FakeStages({"a": 1}, blamed=True, wrong=frozenset({"a"})),
                        ["a"])["a"]
    assert (alone["status"], alone["blame"]) == ("error", "environment"), alone   # alone already: the judge's call


def test_a_check_whose_workdir_could_not_load_for_cuda_memory_beside_another_is_judged_again_alone(
        monkeypatch, tmp_path):
    """At --share 8 on an H100 an honest check beside the memory hog's failed loading its workdir (CUDA's
    out-of-memory error): judged again alone, it passes; alone, the same failure is the workdir's."""
    fake = FakeStages({"a": 1}, overlap=2, at_load=True)
    found = _pool_lines(monkeypatch, tmp_path, fake, ["a", "b"])
    assert (found["a"]["status"], found["a"]["passed"]) == ("judged", True), found["a"]["reason"]
    runs = [(device, beside) for name, device, beside in fake.calls if name == "a"]
    assert len(runs) == 2 and runs[1] == ("0", set())
    seconds = found["a"]["seconds"]
    assert [k for k in seconds if "_again" in k] == ["check_again_alone"]
    # the parts of the stage's seconds are the last attempt's, as a replay reads them: it did not pause
    assert "check_paused" not in seconds and seconds["check_before_place"] < seconds["check"] - seconds[
        "check_again_alone"], seconds
    note = found["a"]["stages"]["check"]["note"]
    assert "beside other checks (model_new.py::TestCorrectness::test_canonical[seed0]: AcceleratorError: CUDA " \
           "error: out of memory); judged again alone" in note, note
    alone = _pool_lines(monkeypatch, tmp_path / "alone", FakeStages({"a": 1}, at_load=True), ["a"])["a"]
    assert (alone["status"], alone["passed"]) == ("judged", False)
    assert "with no other check beside it, so the shortfall is this workdir's" in alone["reason"], alone["reason"]


def test_a_shortfall_with_the_gpu_to_itself_is_the_workdirs_and_says_so_with_the_numbers(monkeypatch, tmp_path):
    fake = FakeStages({"a": 1})
    line = _pool_lines(monkeypatch, tmp_path, fake, ["a"])["a"]
    assert (line["status"], line["passed"]) == ("judged", False)
    assert len([c for c in fake.calls if c[0] == "a"]) == 1    # alone already: not run again
    reason = line["reason"]
    assert "ran out of device memory on GPU 0 (80.00 GiB in all) with no other check beside it" in reason
    assert "the shortfall is this workdir's" in reason and "needs about 32.69 GiB" in reason
    assert "28.19 GiB is free" in reason and "race" not in reason and "flaky" not in reason


# ------------------------------------------------------------------ a model.py that hangs at import

def test_the_build_stage_ends_a_workdir_whose_model_py_never_finishes_importing(make_workdir, tmp_path):
    """The memory estimate imports model.py under cudaopt_timeout: one timeout, the line says where."""
    work = make_workdir("cpu_scale")
    model = work / "model.py"
    model.write_text(model.read_text().replace("import torch.nn as nn\n", "import torch.nn as nn\nimport time\n\n"
                                                                           "time.sleep(3600)\n", 1))
    # The suite's object cache: the prebuilt copy's objects, not a rebuild from nothing.
    options = Options(cache_dir=JUDGE_CACHE, pytest_args=["--cudaopt-device=cpu", "--cudaopt-timeout=2"])
    started = time.monotonic()
    result = stages.run_stage("build", work, tmp_path / "out", cpu_slots(1), None, options)
    # Ended at its timeout, not by the 3600 s sleep (the stage's start and build take tens of seconds
    # on a loaded 2-core machine; the one-timeout-per-workdir bound is test_shortfalls.py's).
    assert time.monotonic() - started < 180
    assert result.status == "timeout", result.tail
    assert "ran longer than cudaopt_timeout=2s while importing model.py" in result.reason
    assert "model.py:7 in <module>: time.sleep(3600)" in result.reason
    line = judge_lines.assemble(workdir="w", key="k", content="", results=[result], seconds={})
    assert line["status"] == "timeout" and "model.py:7" in line["reason"]


def test_a_stage_whose_item_timed_out_ends_the_workdir_even_though_its_session_went_on(tmp_path):
    """MN010 hung on model_new.py's import; the policy child ended normally: the stage is a timeout."""
    test = "model_new.py::TestPolicy::test_rule[MN010]"
    report = {"schema": "cudaopt-report/2", "passed": False, "complete": True, "results": [],
              "items": [{"test": test, "kind": "policy", "status": "failed",
                         "reason": f"TIMEOUT: {test} ran longer than cudaopt_timeout=4s while importing ..."}]}
    (tmp_path / "policy.json").write_text(json.dumps(report))
    (tmp_path / "policy.xml").write_text(
        '<testsuites><testsuite><testcase classname="model_new.TestPolicy" name="test_rule[MN010]">'
        '<failure message="TIMEOUT"/></testcase></testsuite></testsuites>')
    outcome = runner.Outcome(1, False, 5.0, "", tmp_path / "policy.log")
    result = stages.read_pytest("policy", outcome, tmp_path / "policy.json", tmp_path / "policy.xml")
    assert result.status == "timeout" and "test_rule[MN010]" in result.reason


# ------------------------------------------------------------------ before any workdir is judged

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_where_no_cluster_answers_gives_a_line_per_workdir_and_exit_3(tmp_path):
    pytest.importorskip("ray", reason="the Ray backend needs the ray extra: pip install -e '.[ray]'")
    for name in ("a", "b"):
        _workdir(tmp_path, name)
    address = f"127.0.0.1:{_free_port()}"   # nothing listens there
    out = tmp_path / "lines.jsonl"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest_cudaopt.cli", "judge", "a", "b", "--ray", address,
                           "--out", str(out), "--no-cache"], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    found = judge_lines.read_lines(out)
    assert sorted(Path(line["workdir"]).name for line in found) == ["a", "b"]
    for line in found:
        assert line["status"] == "error" and not line["passed"]
        assert f"no Ray cluster answered at --ray {address}" in line["reason"]
    assert "nothing judged" in proc.stdout and "per hour" not in proc.stdout


def test_ray_with_no_node_that_has_a_gpu_gives_a_line_per_workdir_and_exit_3(tmp_path):
    """A cluster of the judge's own on this machine: CPUs only, so no node for a GPU workdir's judge."""
    pytest.importorskip("ray", reason="the Ray backend needs the ray extra: pip install -e '.[ray]'")
    for name in ("a", "b"):
        _workdir(tmp_path, name)
    out = tmp_path / "lines.jsonl"
    env = {**subprocess_env(), "CUDA_VISIBLE_DEVICES": ""}   # Ray counts no GPU, whatever the machine has
    proc = subprocess.run([sys.executable, "-m", "pytest_cudaopt.cli", "judge", "a", "b", "--ray", "local",
                           "--out", str(out), "--no-cache"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    found = judge_lines.read_lines(out)
    assert sorted(Path(line["workdir"]).name for line in found) == ["a", "b"]
    assert all(line["status"] == "error" and "no live node of the Ray cluster at --ray local has a GPU" in line["reason"]
               for line in found)
    assert "nothing judged" in proc.stdout and "per hour" not in proc.stdout


def test_the_judges_own_failure_before_judging_gives_each_workdir_a_line(tmp_path, monkeypatch):
    for name in ("a", "b"):
        _workdir(tmp_path / "workdirs", name)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))   # where the pool's own scratch folder would go
    options = Options(jobs=0, cache_dir=None, pytest_args=["--cudaopt-device=cpu"])   # the scheduler refuses it
    found = list(Judge([tmp_path / "workdirs"], options))
    assert sorted(Path(line["workdir"]).name for line in found) == ["a", "b"]
    assert all(line["status"] == "error" and "jobs and share must be at least 1" in line["reason"] for line in found)
    assert not list(temp.iterdir()), "a scratch folder was left behind"


def test_a_scratch_folder_left_by_a_killed_judge_of_this_host_is_removed_by_the_next(tmp_path, monkeypatch):
    """A judge killed outright (SIGKILL, a lost Ray actor) leaves its scratch folder, the workdirs' copies in it; the
    next pool of that host and user removes it. A live judge's, another host's and any other folder stay."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    host = socket.gethostname()
    dead = tmp_path / f"cudaopt-judge-{host}-{gone.pid}-abcd1234"
    (dead / "00000").mkdir(parents=True)
    alive = tmp_path / f"cudaopt-judge-{host}-{os.getpid()}-efgh5678"
    elsewhere = tmp_path / f"cudaopt-judge-{host}x-{gone.pid}-ijkl9012"   # another host of a longer name
    odd = tmp_path / f"cudaopt-judge-{host}-{gone.pid}-2-mnop3456"          # not a scratch folder's name
    for folder in (alive, elsewhere, odd):
        folder.mkdir()
    made = own_folder("judge")
    assert not dead.exists() and alive.exists() and elsewhere.exists() and odd.exists()
    assert made.parent == tmp_path and made.name.startswith(f"cudaopt-judge-{host}-{os.getpid()}-"), made


def test_with_nothing_judged_the_summary_gives_no_rate():
    found = [judge_lines.unjudged(f"w{i}", f"k{i}", "error", "no GPU visible") for i in range(3)]
    text = summary(found, wall_s=0.0, busy={})
    assert "3 workdirs in 0.0 s: 0 passed; nothing judged" in text and "per hour" not in text
    judged = [{**found[0], "status": "judged"}, *found[1:]]
    assert "3 workdirs in 60.0 s: 0 passed; 60 workdirs per hour" in summary(judged, wall_s=60.0, busy={})


def test_without_a_gpu_the_judge_gives_the_whole_command_line_for_cpu_workdirs(tmp_path):
    workdirs = [_workdir(tmp_path, "a"), _workdir(tmp_path, "b")]
    found = list(pool.LocalPool(workdirs, Options(), DeviceSet([])).lines())
    assert [line["status"] for line in found] == ["error", "error"]
    reason = found[0]["reason"]
    assert f"`cudaopt judge {workdirs[0]} {workdirs[1]} -- --cudaopt-device=cpu`" in reason
    assert 'cudaopt_device = "cpu" in each workdir\'s pyproject.toml' in reason


def test_workdirs_that_record_the_cpu_are_judged_on_cpu_slots_unless_a_flag_says_otherwise(tmp_path):
    for name in ("a", "b"):
        (_workdir(tmp_path, name) / "pyproject.toml").write_text(
            '[tool.pytest.ini_options]\ncudaopt_device = "cpu"\n')
    assert Judge([tmp_path]).options.cpu                  # as `cudaopt init --device cpu` leaves them
    assert not Judge([tmp_path], Options(pytest_args=["--cudaopt-device=cuda"])).options.cpu  # the flag wins
    assert Judge([tmp_path / "a"], Options(pytest_args=["--cudaopt-device", "cpu"])).options.cpu
    _workdir(tmp_path, "gpu")                             # one that records nothing: the GPUs, as before
    assert not Judge([tmp_path]).options.cpu
