"""Whose fault a failure is: the candidate's fails the verdict; the environment's (exit 75) and the harness's (exit 70) leave the run incomplete."""

from __future__ import annotations

import json
import os

import pytest
import torch

from support import run_pytest

from pytest_cudaopt.results import blame
from pytest_cudaopt.primitives import nvml
from pytest_cudaopt.results.ledger import Ledger

GiB = 1 << 30
CANONICAL = ("wd/model_new.py", "-m", "correctness", "-k", "canonical and seed0", "--cudaopt-device=cpu",
             "--cudaopt-report=r.json")
# The judging process's host memory as a busy machine leaves it: 0.5 GiB free.
SHORT_OF_MEMORY = '''
import pytest_cudaopt.primitives.memory

pytest_cudaopt.primitives.memory.host_free_bytes = lambda *args, **kwargs: 1 << 29
'''
# NVML's process table of a machine where every process but this one (the candidate's worker among
# them) holds 110 GiB.
WORKER_HOLDS_110_GIB = SHORT_OF_MEMORY + '''
import os

import pytest_cudaopt.primitives.nvml

pytest_cudaopt.primitives.nvml.processes = lambda index=0: [{"pid": int(pid), "used_bytes": 110 << 30} for pid in os.listdir("/proc")
                                                 if pid.isdigit() and int(pid) != os.getpid()]
'''
HARNESS_BUG = '''
import pytest_cudaopt.suite.correctness


def _broken(*args, **kwargs):
    # several lines, as torch's CUDA errors have: the reason is the first, not the hint last
    raise RuntimeError("a key the harness forgot\\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")


pytest_cudaopt.suite.correctness.judge_canonical = _broken
'''
# The judging process runs out of device memory while a neighbour holds it (torch's message, as a perf stage met it).
NEIGHBOUR_HOLDS = '''
import torch
import pytest_cudaopt.suite.correctness


def _short(*args, **kwargs):
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which 106.94 MiB "
        "is free. Process 4987 has 1.03 GiB memory in use. Including non-PyTorch memory, this process has 1.40 GiB "
        "memory in use. Process 8185 has 73.17 GiB memory in use.")


pytest_cudaopt.suite.correctness.judge_canonical = _short
'''
CRASHING = '''"""Kills its own process in forward."""

import os
import signal

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        os.kill(os.getpid(), signal.SIGKILL)
'''


def _canonical_item(doc: dict) -> dict:
    [item] = [i for i in doc["items"] if i["kind"] == "correctness"]
    return item


def _run(pytester, make_workdir, conftest: str = "", model_new: str = ""):
    work = make_workdir("cpu_scale", pytester.path / "wd")
    if conftest:
        (pytester.path / "conftest.py").write_text(conftest)
    if model_new:
        (work / "model_new.py").write_text(model_new)
    result = run_pytest(pytester, *CANONICAL, timeout=300)
    return result, json.loads((pytester.path / "r.json").read_text())


def test_a_host_memory_shortfall_before_the_candidate_runs_is_the_environments_and_exits_75(pytester, make_workdir):
    result, doc = _run(pytester, make_workdir, SHORT_OF_MEMORY)
    item = _canonical_item(doc)
    assert item["status"] == "failed" and item["blame"] == "environment", item
    assert "of host memory, only 0.50 GiB is free" in item["reason"], item
    assert doc["passed"] is False and doc["complete"] is False, doc
    assert doc["cause"] == "environment" and doc["blame"] == "environment", doc
    assert "not the candidate's" in doc["reason"] and "only 0.50 GiB is free" in doc["reason"], doc["reason"]
    [record] = [r["data"] for r in doc["results"] if r["kind"] == "correctness"]
    assert record["check"] == "memory" and record["blame"] == "environment"
    assert result.ret == 75, result.stdout.str()[-3000:]


def test_a_candidate_whose_worker_holds_more_than_the_case_allows_is_blamed_with_the_figures(pytester, make_workdir):
    result, doc = _run(pytester, make_workdir, WORKER_HOLDS_110_GIB)
    item = _canonical_item(doc)
    assert item["status"] == "failed" and item["blame"] == "candidate", item
    said = ") holds 110.00 GiB; the workdir's largest case with ModelNew's weights allows"
    assert "ModelNew's process (pid " in item["reason"] and said in item["reason"], item["reason"]
    assert doc["passed"] is False and doc["complete"] is True and doc["blame"] == "candidate", doc
    assert result.ret == 1


LOGGED_STOPS = '''
import pathlib

import pytest_cudaopt.remote.worker as remote_worker

_stop = remote_worker.Worker.stop


def _logged(self):
    if self.alive():
        with open("events.log", "a") as log:
            log.write("stopped\\n")
    _stop(self)


remote_worker.Worker.stop = _logged


def pytest_runtest_logstart(nodeid, location):
    with open("events.log", "a") as log:
        log.write(f"start {nodeid.split('::')[-1]}\\n")
'''


def test_a_worker_found_holding_more_than_its_workdir_allows_is_stopped_at_once_and_later_items_fail_unrun(
        pytester, make_workdir):
    """A hog frees the device as soon as an item finds it (a judge's other checks share it): its worker is stopped
    before the next item, which fails unrun, naming the item that found it."""
    make_workdir("cpu_scale", pytester.path / "wd")
    (pytester.path / "conftest.py").write_text(WORKER_HOLDS_110_GIB + LOGGED_STOPS)
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--cudaopt-device=cpu",
                        "--cudaopt-report=r.json", timeout=300)
    doc = json.loads((pytester.path / "r.json").read_text())
    items = {i["test"].split("::")[-1]: i for i in doc["items"] if i["kind"] == "correctness"}
    first = items["test_canonical[seed0]"]
    assert first["status"] == "failed" and "holds 110.00 GiB" in first["reason"], first
    for name in ("test_canonical[seed1]", "test_canonical[seed2]", "test_drawn_shapes"):
        said = items[name]["reason"]
        assert items[name]["status"] == "not run", items[name]
        assert said.startswith("not run: ") and "test_canonical[seed0] found ModelNew's process (pid " in said, said
        assert "holds 110.00 GiB" in said and "its worker was stopped" in said, said
    events = (pytester.path / "events.log").read_text().split("\n")
    assert events.index("stopped") < events.index("start test_canonical[seed1]"), events
    assert doc["complete"] is True and doc["blame"] == "candidate" and result.ret == 1


@pytest.mark.parametrize("conftest, blamed", [(SHORT_OF_MEMORY, "environment"), (WORKER_HOLDS_110_GIB, "candidate")],
                         ids=["memory short", "worker holds 110 GiB"])
def test_drawn_shapes_that_memory_left_no_room_for_are_blamed_on_whoever_holds_it(pytester, make_workdir, conftest,
                                                                                blamed):
    work = make_workdir("cpu_scale", pytester.path / "wd")
    # The width is fixed (64): no drawn shape has fewer than 64 elements, more than memory leaves room for.
    model = (work / "model.py").read_text().replace("features = 64\n", "")
    (work / "model.py").write_text(model.replace("(batch_size, features)", "(batch_size, 64)")
                                   .replace("[features]", "[64]"))
    (pytester.path / "conftest.py").write_text(conftest)
    run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "-k", "drawn", "--cudaopt-device=cpu",
               "--cudaopt-report=r.json", timeout=300)
    doc = json.loads((pytester.path / "r.json").read_text())
    [item] = [i for i in doc["items"] if i["kind"] == "correctness"]
    assert item["status"] == "failed" and item["blame"] == blamed, item
    [record] = [r["data"] for r in doc["results"] if r["kind"] == "correctness"]
    assert record["check"] == "memory", record
    assert "no drawn shape could be judged" in record["message"] and "drawn shapes capped at 1 input elements" \
        in record["message"], record["message"]
    named = "ModelNew's process" in item["reason"] and "holds 110.00 GiB" in item["reason"]
    assert named == (blamed == "candidate"), item["reason"]
    assert doc["complete"] is (blamed == "candidate"), doc


def test_too_few_drawn_shapes_because_memory_capped_them_is_the_environments(pytester, make_workdir):
    # Free memory leaves room for 100 input elements: one drawn shape (1 x 64), short of a handful. On a
    # crowded H200 this failed as the candidate's own ("only 1 distinct valid shapes"), blame candidate.
    work = make_workdir("cpu_scale", pytester.path / "wd")
    model = (work / "model.py").read_text().replace("features = 64\n", "")
    (work / "model.py").write_text(model.replace("(batch_size, features)", "(batch_size, 64)")
                                   .replace("[features]", "[64]"))
    (pytester.path / "conftest.py").write_text(SHORT_OF_MEMORY.replace("1 << 29", "(2 << 30) + 4 * 8 * 100"))
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "-k", "drawn", "--cudaopt-device=cpu",
                        "--cudaopt-report=r.json", timeout=300)
    doc = json.loads((pytester.path / "r.json").read_text())
    [item] = [i for i in doc["items"] if i["kind"] == "correctness"]
    assert item["status"] == "failed" and item["blame"] == "environment", item
    assert "only 1 distinct valid shapes" in item["reason"] and "capped at 100 input elements" in item["reason"], item
    assert doc["complete"] is False and result.ret == 75, doc


def test_a_crashing_candidate_is_the_candidates_fault(pytester, make_workdir):
    result, doc = _run(pytester, make_workdir, model_new=CRASHING)
    item = _canonical_item(doc)
    assert item["status"] == "failed" and item["blame"] == "candidate", item
    assert "CRASH" in item["reason"], item
    assert doc["passed"] is False and doc["complete"] is True and doc["blame"] == "candidate", doc
    assert result.ret == 1


def test_an_unexpected_exception_in_the_harness_is_the_harnesss_and_exits_70(pytester, make_workdir):
    result, doc = _run(pytester, make_workdir, HARNESS_BUG)
    item = _canonical_item(doc)
    assert item["status"] == "failed" and item["blame"] == "harness", item
    assert "a key the harness forgot" in item["reason"] and "TORCH_USE_CUDA_DSA" not in item["reason"], item
    assert doc["passed"] is False and doc["complete"] is False and doc["cause"] == "harness", doc
    assert doc["blame"] == "harness"
    assert result.ret == 70, result.stdout.str()[-3000:]


def test_device_memory_the_judging_process_cannot_get_beside_a_neighbour_is_the_environments_and_exits_75(
        pytester, make_workdir):
    result, doc = _run(pytester, make_workdir, NEIGHBOUR_HOLDS)
    item = _canonical_item(doc)
    assert item["status"] == "failed" and item["blame"] == "environment", item
    assert "CUDA out of memory" in item["reason"], item
    assert doc["passed"] is False and doc["complete"] is False and doc["cause"] == "environment", doc
    assert result.ret == 75, result.stdout.str()[-3000:]


def test_an_out_of_memory_error_is_the_harnesss_only_where_the_judging_process_held_the_most():
    others = ("Including non-PyTorch memory, this process has 1.40 GiB memory in use. "
              "Process 8 has 73.17 GiB memory in use.")
    own = ("Process 8 has 900.00 MiB memory in use. "
           "Including non-PyTorch memory, this process has 70.02 GiB memory in use.")
    assert blame.classify(torch.OutOfMemoryError(f"CUDA out of memory. {others}")) == blame.ENVIRONMENT
    assert blame.classify(torch.OutOfMemoryError(f"CUDA out of memory. {own}")) == blame.HARNESS
    assert blame.classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == blame.ENVIRONMENT
    # the candidate's own out-of-memory error reaches the harness wrapped: it stays the candidate's
    wrapped = blame.classify(type("CandidateError", (Exception,), {})("ModelNew: CUDA out of memory. " + own))
    assert wrapped == blame.CANDIDATE
    # model.py's get_inputs() ran out in the judging process: wrapped as the workdir's error, still not the candidate's
    workdir_error = type("WorkdirError", (Exception,), {})
    try:
        try:
            raise torch.OutOfMemoryError(f"CUDA out of memory. {own}")
        except torch.OutOfMemoryError as exc:
            raise workdir_error("model.py: get_inputs() raised: ...") from exc
    except workdir_error as exc:
        assert blame.classify(exc) == blame.HARNESS
    try:   # an error that hides what it replaced (`from None`) is judged by itself
        try:
            raise torch.OutOfMemoryError(f"CUDA out of memory. {own}")
        except torch.OutOfMemoryError:
            raise workdir_error("model.py: get_inputs() raised: ...") from None
    except workdir_error as exc:
        assert blame.classify(exc) == blame.CANDIDATE


def test_a_device_busy_or_unavailable_is_the_environments_and_our_own_bugs_are_the_harnesss():
    busy = RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable")
    assert blame.classify(busy) == blame.ENVIRONMENT
    assert blame.classify(KeyError("x")) == blame.HARNESS
    assert blame.classify(None, "wrong answer at [0, 1]") == blame.CANDIDATE
    assert (blame.exit_status(blame.ENVIRONMENT), blame.exit_status(blame.HARNESS),
            blame.exit_status(blame.CANDIDATE)) == (75, 70, None)


def test_memory_held_by_other_processes_names_them_and_is_the_environments():
    table = [{"pid": 41, "used_bytes": 70 * GiB}, {"pid": 42, "used_bytes": 1 * GiB}, {"pid": 7, "used_bytes": 3 * GiB}]
    who, why = blame.memory_blame(4 * GiB, 6 * GiB, 7, table)
    assert who == blame.ENVIRONMENT and "pid 41 70.00 GiB, pid 42 1.00 GiB" in why and "pid 7" not in why, why
    who, why = blame.memory_blame(4 * GiB, 2 * GiB, 7, table)
    assert who == blame.CANDIDATE and why == "ModelNew's process (pid 7) holds 3.00 GiB; this case allows 2.00 GiB"


def test_memory_the_judging_process_kept_is_the_harness_not_another_process():
    # The judging process (pid 9) holds what earlier cases left cached: named as itself, blamed on the harness.
    kept = [{"pid": 9, "used_bytes": 76 * GiB}, {"pid": 7, "used_bytes": 1 * GiB}]
    who, why = blame.memory_blame(20 * GiB, 60 * GiB, 7, kept, judge_pid=9)
    assert who == blame.HARNESS and why.startswith("the judging process (pid 9) holds 76.00 GiB"), why
    assert blame.memory_blame(20 * GiB, 60 * GiB, 7, kept, own=True, judge_pid=9)[0] == blame.HARNESS
    # What a case needs, or less than a neighbour holds, is not the judge's fault; it is never listed as another's.
    for table in ([{"pid": 9, "used_bytes": 3 * GiB}, {"pid": 41, "used_bytes": 70 * GiB}],
                  [{"pid": 9, "used_bytes": 30 * GiB}, {"pid": 41, "used_bytes": 40 * GiB}]):
        who, why = blame.memory_blame(20 * GiB, 60 * GiB, 7, table, judge_pid=9)
        assert who == blame.ENVIRONMENT and "pid 41" in why and "pid 9" not in why, why
    assert blame.memory_blame(4 * GiB, 6 * GiB, 7, [{"pid": os.getpid(), "used_bytes": 9 * GiB}])[0] == blame.HARNESS


def test_the_candidates_own_out_of_memory_is_the_environments_only_where_others_hold_more_than_its_budget():
    crowded = [{"pid": 41, "used_bytes": 70 * GiB}, {"pid": 7, "used_bytes": 1 * GiB}]
    who, why = blame.memory_blame(4 * GiB, 6 * GiB, 7, crowded, own=True)
    assert who == blame.ENVIRONMENT and "pid 41 70.00 GiB" in why, why
    quiet = [{"pid": 41, "used_bytes": 1 * GiB}, {"pid": 7, "used_bytes": 1 * GiB}]
    assert blame.memory_blame(4 * GiB, 6 * GiB, 7, quiet, own=True) == (blame.CANDIDATE, "")
    assert blame.memory_blame(4 * GiB, 6 * GiB, 7, [], own=True) == (blame.CANDIDATE, "")
    assert blame.memory_blame(4 * GiB, 6 * GiB, 7, quiet)[0] == blame.ENVIRONMENT  # the judging side's own


def test_nvml_answers_with_nothing_where_it_is_absent_and_with_a_given_table(monkeypatch):
    monkeypatch.setattr(nvml, "TABLE", None)
    monkeypatch.delenv(nvml.TABLE_ENV, raising=False)
    if nvml._library() is None:  # this machine has no NVIDIA driver
        assert nvml.processes() == [] and nvml.used_by(1) is None and not nvml.available()
    monkeypatch.setenv(nvml.TABLE_ENV, json.dumps([{"pid": 5, "used_bytes": 9}]))
    assert nvml.processes() == [{"pid": 5, "used_bytes": 9}] and nvml.used_by(5) == 9 and nvml.used_by(6) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert nvml.index_of(1) == 1 and nvml.index_of(0) == 3


def test_an_item_failed_for_the_environment_leaves_the_account_incomplete_and_a_candidates_does_not():
    ledger = Ledger()
    ledger.collect("wd/model_new.py::TestCorrectness::test_canonical[seed0]", "correctness", "wd")
    ledger.report("wd/model_new.py::TestCorrectness::test_canonical[seed0]", "correctness", "wd", "call", "failed",
                  "out of memory", {blame.PROPERTY: blame.ENVIRONMENT})
    account = ledger.account()
    assert (account.passed, account.complete, account.cause, account.blame) == (False, False, "environment",
                                                                                 "environment")
    assert account.items[0].to_json()["blame"] == "environment"
    ledger = Ledger()
    ledger.collect("t", "correctness", "wd")
    ledger.report("t", "correctness", "wd", "call", "failed", "mismatch at [0]", {})
    account = ledger.account()
    assert (account.passed, account.complete, account.cause, account.blame) == (False, True, None, "candidate")


def test_a_worker_is_allowed_what_its_largest_case_left_cached_not_only_the_small_case_that_came_short(
        monkeypatch, tmp_path):
    import types

    from pytest_cudaopt.correctness.case import holder

    reference = types.ModuleType("model")
    exec("import torch\nbatch_size, features = 4096, 8192\n"
         "def get_inputs():\n    return [torch.randn(batch_size, features)]\n"
         "def get_init_inputs():\n    return []\n"
         "class Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n", reference.__dict__)
    worker = types.SimpleNamespace(proc=types.SimpleNamespace(pid=7))
    workdir = types.SimpleNamespace(reference=reference, worker=worker)
    settings = types.SimpleNamespace(device="cpu", max_elements=None)
    # The worker holds 3 GiB (the canonical case's inputs and outputs, 256 MiB, cached, and its context),
    # more than a small drawn case's 2.1 GiB; another process holds 100 GiB.
    monkeypatch.setattr(nvml, "processes", lambda index=0: [{"pid": 7, "used_bytes": 3 * GiB},
                                                           {"pid": 41, "used_bytes": 100 * GiB}])
    who, why = holder(workdir, settings, 2 * GiB, 2 * GiB + (100 << 20))
    assert who == blame.ENVIRONMENT and "pid 41 100.00 GiB" in why, why
    monkeypatch.setattr(nvml, "processes", lambda index=0: [{"pid": 7, "used_bytes": 120 * GiB}])
    who, why = holder(workdir, settings, 2 * GiB, 2 * GiB + (100 << 20))
    assert who == blame.CANDIDATE and "holds 120.00 GiB; the workdir's largest case allows" in why, why


def test_a_worker_is_allowed_modelnews_weights_beside_its_largest_case(monkeypatch):
    """An honest ModelNew of 1 GiB of weights holds them, and may hold a copy it derives, beside its cases."""
    import types

    from pytest_cudaopt.correctness.case import holder

    reference = types.ModuleType("model")
    exec("import torch\nbatch_size, features = 16, 16384\n"
         "def get_inputs():\n    return [torch.randn(batch_size, features)]\n"
         "def get_init_inputs():\n    return [features]\n"
         "class Model(torch.nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
         "        self.linear = torch.nn.Linear(n, n)\n    def forward(self, x):\n        return self.linear(x)\n",
         reference.__dict__)
    worker = types.SimpleNamespace(proc=types.SimpleNamespace(pid=7))
    workdir = types.SimpleNamespace(reference=reference, worker=worker)
    settings = types.SimpleNamespace(device="cpu", max_elements=None)
    # its cases' budget is about 2 GiB; it holds that and its weights twice (3.0 GiB in all)
    monkeypatch.setattr(nvml, "processes", lambda index=0: [{"pid": 7, "used_bytes": 4 * GiB},
                                                           {"pid": 41, "used_bytes": 70 * GiB}])
    who, why = holder(workdir, settings, 2 * GiB, 2 * GiB)
    assert who == blame.ENVIRONMENT and "pid 41 70.00 GiB" in why, why
    monkeypatch.setattr(nvml, "processes", lambda index=0: [{"pid": 7, "used_bytes": 6 * GiB}])
    who, why = holder(workdir, settings, 2 * GiB, 2 * GiB)
    assert who == blame.CANDIDATE and "holds 6.00 GiB; the workdir's largest case with ModelNew's weights" in why, why


# The worker's device memory as NVML would give it (the CPU has none): `extra` bytes past the hoarding line.
HOARDS = '''
import pytest_cudaopt.suite.correctness as items

EXTRA = {extra}
items.held_bytes = lambda loaded, settings: 2 * items.allowance(loaded, settings)[0] + items.HOARD_SLACK + EXTRA
'''


@pytest.mark.parametrize("extra, hoards", [(0, False), (1, True)], ids=["at the line", "past it"])
def test_a_worker_holding_far_more_than_its_cases_need_fails_though_no_case_ran_short(pytester, make_workdir, extra,
                                                                                     hoards):
    """Beside other checks a memory hog takes what is free, so its own cases need not run short, and once passed
    where it fails alone (an H100 run). Past twice its allowance and 8 GiB more, the item fails it, and its worker is
    stopped; up to that line it passes."""
    make_workdir("cpu_scale", pytester.path / "wd")
    (pytester.path / "conftest.py").write_text(HOARDS.format(extra=extra) + LOGGED_STOPS)
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "--cudaopt-device=cpu",
                        "--cudaopt-report=r.json", timeout=300)
    doc = json.loads((pytester.path / "r.json").read_text())
    items = {i["test"].split("::")[-1]: i for i in doc["items"] if i["kind"] == "correctness"}
    first = items["test_canonical[seed0]"]
    if not hoards:
        assert {i["status"] for i in items.values()} == {"passed"} and result.ret == 0, items
        return
    assert first["status"] == "failed" and first["blame"] == "candidate", first
    assert "ModelNew's process (pid " in first["reason"] and "it took device memory its cases do not need" \
        in first["reason"], first["reason"]
    [record] = [r["data"] for r in doc["results"] if r["kind"] == "correctness" and r["data"].get("check")]
    assert record["check"] == "memory" and record["worker_bytes"] > 8 << 30, record
    assert items["test_drawn_shapes"]["status"] == "not run", items
    events = (pytester.path / "events.log").read_text().split("\n")
    assert events.index("stopped") < events.index("start test_canonical[seed1]"), events
    assert doc["blame"] == "candidate" and result.ret == 1


def test_figures_the_timing_gate_could_not_check_for_want_of_device_memory_are_the_other_holders(monkeypatch):
    """ModelNew's figures fall back to the round trip when its timing gate, set up before the workdir loads, finds no
    device memory (a neighbour's hog): the failure is whoever holds the memory (NVML), with the gate's error named,
    not the candidate's by default. Any other reason the gate is missing, or figures that could be checked, is
    left alone."""
    import pytest_cudaopt.correctness.case as case
    from pytest_cudaopt.suite import perf as perf_item

    class Worker:
        stream_gate_error = "AcceleratorError: CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'"

    class Model:
        worker = Worker()

        def __init__(self, failure: str):
            self.failure = failure

        def timing_failure(self) -> str:
            return self.failure

    asked = []
    monkeypatch.setattr(case, "holder", lambda workdir, settings, need, budget, own=False: asked.append(need) or (
        "environment", "other processes hold the device memory this case needs (2.00 GiB): pid 7 70.00 GiB"))
    unresolved = Model("ModelNew's calls could be timed only by the round trip to its process, ...")
    who, why = perf_item.gate_shortfall(unresolved, workdir=None, settings=None)
    assert who == "environment" and asked, (who, why)
    assert why.startswith("its timing gate was not set up: AcceleratorError: CUDA error: out of memory;"), why
    assert "pid 7 70.00 GiB" in why and "Search for" not in why
    assert perf_item.gate_shortfall(Model(""), None, None) is None        # its figures were checked another way
    Worker.stream_gate_error = "WindowError: no shared memory"
    assert perf_item.gate_shortfall(unresolved, None, None) is None       # no gate for another reason
