"""The memory-safety item without a GPU: compute-sanitizer's recorded reports read into `kernels/x.cu:line` findings, and the item's plumbing (the child, the time plan, the skips) run against a stand-in sanitizer."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from support import WORKDIRS, run_pytest

from pytest_cudaopt.memsafety import verdict as memsafety, log as sanitizer_log

LOGS = Path(__file__).resolve().parent / "sanitizer_logs"
CUDA_WORKDIR = WORKDIRS / "cuda_memsafety"
BUILD_DIR = CUDA_WORKDIR / "build" / "cudaopt" / "cuda-9.0-1f2e3d"  # where the build names sources from


def read(tool: str, name: str) -> sanitizer_log.Report:
    return sanitizer_log.read(tool, (LOGS / name).read_text(), CUDA_WORKDIR, BUILD_DIR)


def marked_line(text: str) -> int:
    """The line of kernels/memsafety.cu whose comment names what a tool must find."""
    lines = (CUDA_WORKDIR / "kernels" / "memsafety.cu").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


# -- reading the sanitizer's report -------------------------------------------------------------------

def test_a_write_past_the_output_is_a_finding_at_its_kernel_line_and_the_api_error_after_it_a_note():
    report = read("memcheck", "memcheck_past_end.log")
    [finding] = report.findings
    assert finding.where == f"kernels/memsafety.cu:{marked_line('the write memcheck must name')}"
    assert finding.line().startswith("kernels/memsafety.cu:33: memcheck: Invalid __global__ write of size 4 bytes "
                                     "in scale_past_end(const float *, const float *, const float *, float *, long, "
                                     "long); by thread (15,0,0) in block (0,0,0); Address 0x7f3c1a200040 is out of "
                                     "bounds; and is 1 bytes after the nearest allocation")
    assert "Host Frame" not in finding.line()
    assert report.summary_errors == 2 and report.records == 2
    assert report.notes == ['memcheck: Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch '
                            'failure" on CUDA API call to cudaStreamSynchronize. (not in the workdir\'s kernels: '
                            'not judged)']


def test_a_shared_memory_race_names_both_accesses():
    [finding] = read("racecheck", "racecheck_shared_race.log").findings
    race = marked_line("the race racecheck must name")
    assert finding.where == f"kernels/memsafety.cu:{race - 1} and kernels/memsafety.cu:{race}"
    assert finding.kernel.startswith("scale_shared_race(") and "[248 hazards]" in finding.line()


def test_a_read_of_uninitialised_memory_is_one_finding_for_all_its_threads_and_torchs_kernels_are_notes():
    report = read("initcheck", "initcheck_uninitialised.log")
    [finding] = report.findings
    assert finding.where == f"kernels/memsafety.cu:{marked_line('the read initcheck must name')}"
    assert finding.count == 16 and "(16 times)" in finding.line()
    [note] = report.notes
    assert "at::native::vectorized_elementwise_kernel" in note and "not judged" in note


def test_errors_inside_cublas_are_notes_not_findings():
    report = read("memcheck", "memcheck_in_cublas.log")
    assert report.findings == [] and len(report.notes) == 1 and "cutlass_80_simt_sgemm" in report.notes[0]


@pytest.mark.parametrize("name", ["memcheck_basename_only.log", "cuda_memcheck_legacy.log"])
def test_a_bare_file_name_and_the_legacy_format_still_map_into_kernels(name):
    [finding] = read("memcheck", name).findings
    assert finding.where == "kernels/memsafety.cu:33" and finding.kernel.startswith("scale_past_end(")


def test_a_clean_report_has_nothing():
    report = read("memcheck", "memcheck_clean.log")
    assert (report.findings, report.notes, report.summary_errors) == ([], [], 0)


def _run(tool: str, name: str, returncode: int, output: str = "") -> memsafety.MemorySafetyResult:
    result = memsafety.MemorySafetyResult(workdir=str(CUDA_WORKDIR), test="t", case="features=1", passed=False)
    run = memsafety.Run(tool, returncode, (LOGS / name).read_text(), output, 1.0)
    memsafety.judge_run(run, CUDA_WORKDIR, BUILD_DIR, result)
    return result


def test_errors_the_reader_cannot_place_fail_rather_than_pass():
    result = _run("memcheck", "memcheck_unreadable.log", memsafety.ERROR_EXIT)
    [failure] = result.failures
    assert "memcheck reported 1 error(s) that could not be read as records" in failure
    assert "Device-side assertion in a form this reader has never seen" in failure


def test_a_case_that_did_not_complete_fails_with_the_childs_last_words():
    result = _run("memcheck", "memcheck_clean.log", 3, "cudaopt memsafety: the case raised RuntimeError: bad shape")
    [failure] = result.failures
    assert "the case did not complete under memcheck (exit status 3)" in failure and "bad shape" in failure


def test_a_path_outside_the_workdir_is_not_the_workdirs(tmp_path):
    assert sanitizer_log.kernel_source("/usr/local/cuda/include/cuda/std/detail/libcxx.h", CUDA_WORKDIR) is None
    assert sanitizer_log.kernel_source("../../../kernels/memsafety.cu", CUDA_WORKDIR, BUILD_DIR) == \
        "kernels/memsafety.cu"
    assert sanitizer_log.kernel_source(str(CUDA_WORKDIR / "kernels" / "memsafety.cu"), CUDA_WORKDIR) == \
        "kernels/memsafety.cu"


# -- the plan ---------------------------------------------------------------------------------------

def test_the_commands_run_memcheck_with_padding_and_the_child_with_the_caching_allocator_off():
    cmd = memsafety.child_command(Path("/wd"), "/wd/build/x.so", "/tmp/own", "cuda",
                                  sanitizer=("/cuda/bin/compute-sanitizer", "memcheck", Path("/tmp/m.log")))
    assert cmd[:7] == ["/cuda/bin/compute-sanitizer", "--tool", "memcheck", "--padding", "32", "--leak-check", "no"]
    assert cmd[cmd.index("--log-file") + 1] == "/tmp/m.log" and "--error-exitcode" in cmd
    assert cmd[-10:] == [sys.executable, "-m", "pytest_cudaopt.candidate.sanitized", "/wd", "--extension",
                         "/wd/build/x.so", "--scratch", "/tmp/own", "--device", "cuda"]
    assert memsafety.child_environment()["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


def test_the_case_is_the_smallest_valid_one_unless_the_setting_names_one(prebuilt_workdir):
    from pytest_cudaopt.workdir import import_file

    path = prebuilt_workdir("cpu_scale")
    reference = import_file("cudaopt_memsafety_test_model", path / "model.py", path)

    class Settings:
        memsafety_case, max_elements = None, None

    assert memsafety.small_case(reference, Settings) == {"features": 1}  # 16 x 1: fewer elements than 1 x 64
    Settings.memsafety_case = "batch_size=3,features=5"
    assert memsafety.small_case(reference, Settings) == {"batch_size": 3, "features": 5}


def test_the_sanitizer_is_found_by_setting_path_or_toolkit_and_its_absence_says_where(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert memsafety.find_sanitizer(str(tool)) == (str(tool), f"cudaopt_compute_sanitizer={tool}")
    assert memsafety.find_sanitizer(str(tmp_path / "nothing"))[0] is None
    monkeypatch.setenv("PATH", str(tool.parent))
    assert memsafety.find_sanitizer(None) == (str(tool), "PATH")
    monkeypatch.setenv("PATH", str(tmp_path))
    import pytest_cudaopt.extension as build

    monkeypatch.setattr(build, "find_cuda_home", lambda: str(tmp_path))
    assert memsafety.find_sanitizer(None) == (str(tool), str(tool.parent))
    monkeypatch.setattr(build, "find_cuda_home", lambda: str(tmp_path / "empty"))
    assert memsafety.find_sanitizer(None) == (None, f"PATH and {tmp_path / 'empty' / 'bin'}")


# -- the item, against a stand-in sanitizer ---------------------------------------------------------------

# Runs the real child (on the CPU), checks what the item promised it, then writes the recorded
# report of its tool ($FAKE_SANITIZER_LOGS/<tool>.log, else a clean one) and exits as
# compute-sanitizer does (--error-exitcode when the report has errors).
FAKE_SANITIZER = '''\
#!{python}
import os, re, subprocess, sys, time
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
log = args[args.index("--log-file") + 1]
child = args[args.index("-m") - 1:]
assert os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1", "the caching allocator is on"
assert tool != "memcheck" or "--padding" in args, "memcheck without --padding"
began = time.time()
scratch = args[args.index("--scratch") + 1]
case_at_start = os.path.exists(os.path.join(scratch, "memsafety-case.pt"))
time.sleep(float(os.environ.get("FAKE_SANITIZER_SLEEP_" + tool.upper(), "0")))
if os.environ.get("FAKE_SANITIZER_OOM"):
    done = subprocess.CompletedProcess(child, 11, "cudaopt memsafety: the case raised AcceleratorError: CUDA error: "
                                       "out of memory\\n", "")
elif os.environ.get("FAKE_SANITIZER_NO_CHILD"):
    done = subprocess.CompletedProcess(child, 0, "", "")
else:
    done = subprocess.run(child, capture_output=True, text=True)
sys.stdout.write(done.stdout + done.stderr)
recorded = os.path.join(os.environ.get("FAKE_SANITIZER_LOGS", "/nonexistent"), tool + ".log")
text = open(recorded).read() if os.path.exists(recorded) else "========= COMPUTE-SANITIZER\\n========= ERROR SUMMARY: 0 errors\\n"
open(log, "w").write(text)
if os.environ.get("FAKE_SANITIZER_SPANS"):  # when each tool ran: the item runs them at once
    case = os.path.join(scratch, "memsafety-case.pt")   # and when its case came
    sent = os.path.getmtime(case) if os.path.exists(case) else 0.0
    open(os.path.join(os.environ["FAKE_SANITIZER_SPANS"], tool), "w").write(
        "%f %f %d %f" % (began, time.time(), case_at_start, sent))
errors = re.search(r"ERROR SUMMARY: (\\d+)", text)
sys.exit(86 if errors and int(errors.group(1)) else done.returncode)
'''
SCALE_PAST_END = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at scale_rows(const float *, const float *, const float *, float *, long, long)+0x1d0 in ../../../kernels/scale.cpp:{line}
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f3c1a200040 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3c1a200000 of size 64 bytes
=========
========= ERROR SUMMARY: 1 error
"""


@pytest.fixture
def sanitized(pytester, make_workdir, monkeypatch, tmp_path):
    """`sanitized(logs={tool: text}, ini="")`: the built CPU workdir at pytester.path/wd judged
    as a self-test on the CPU with the stand-in sanitizer (the real child runs)."""
    monkeypatch.setenv("CUDAOPT_SELF_TEST", "1")
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setenv("FAKE_SANITIZER_LOGS", str(logs))

    def make(logs_by_tool=None, ini=""):
        path = make_workdir("cpu_scale", dest=pytester.path / "wd")
        (path / "pytest.ini").write_text(f"[pytest]\ncudaopt_device = cpu\ncudaopt_compute_sanitizer = {fake}\n{ini}")
        for tool, text in (logs_by_tool or {}).items():
            (logs / f"{tool}.log").write_text(text)
        return path

    return make


def scale_line() -> int:
    lines = (WORKDIRS / "_shared" / "kernels" / "scale.cpp").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "yr[f] = xr[f] * weight[f] + bias[f]" in line)


def test_the_item_passes_a_clean_workdir_after_all_three_tools_run_at_once(pytester, sanitized, monkeypatch,
                                                                            tmp_path):
    sanitized()
    spans = tmp_path / "spans"
    spans.mkdir()
    monkeypatch.setenv("FAKE_SANITIZER_SPANS", str(spans))
    for tool in ("MEMCHECK", "RACECHECK", "INITCHECK"):
        monkeypatch.setenv(f"FAKE_SANITIZER_SLEEP_{tool}", "3")
    result = run_pytest(pytester, "wd", "-m", "memsafety", "--cudaopt-report=report.json", "-rA")
    result.assert_outcomes(passed=1)
    [record] = [r for r in json.loads((pytester.path / "report.json").read_text())["results"]
                if r["kind"] == "memsafety"]
    data = record["data"]
    assert data["passed"] and data["case"] == "features=1" and data["findings"] == []
    assert data["tools"] == {"memcheck": "clean", "racecheck": "clean", "initcheck": "clean"}
    assert set(data["seconds_by_tool"]) == {"memcheck", "racecheck", "initcheck"}
    # Each tool sleeps 3 s before its child: run one after another, no two would overlap.
    ran = {p.name: [float(t) for t in p.read_text().split()] for p in spans.iterdir()}
    assert set(ran) == {"memcheck", "racecheck", "initcheck"}
    assert max(b for b, *_ in ran.values()) < min(e for _, e, *_ in ran.values()), ran
    # Started ahead, as soon as the workdir was built: before its case was drawn
    assert not any(case_there for _, _, case_there, _ in ran.values()), ran
    result.stdout.fnmatch_lines(["*cudaopt memsafety: 1 of 1 passed*"])


ITEM_TIMES = """\
import time

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if "Correctness" in item.nodeid:
        time.sleep(1.5)   # slow correctness items: the sanitized case has time to finish beside them
    with open({log!r}, "a") as handle:
        handle.write(f"{{item.nodeid}} {{time.time()}}\\n")
    return (yield)
"""


def test_the_case_is_sent_as_the_workdir_loads_and_runs_beside_the_correctness_items(pytester, sanitized,
                                                                                      monkeypatch, tmp_path):
    path = sanitized()
    spans, times = tmp_path / "spans", tmp_path / "times.txt"
    spans.mkdir()
    (path / "conftest.py").write_text(ITEM_TIMES.format(log=str(times)))
    monkeypatch.setenv("FAKE_SANITIZER_SPANS", str(spans))
    result = run_pytest(pytester, "wd", "-m", "not perf and not policy", "--cudaopt-report=report.json", "-rA")
    assert result.ret == 0, result.stdout.str()[-3000:]
    started = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in times.read_text().splitlines()}
    [memsafety_at] = [t for nodeid, t in started.items() if "MemorySafety" in nodeid]
    assert sum("Correctness" in nodeid for nodeid in started) >= 2 and max(
        t for nodeid, t in started.items() if "Correctness" in nodeid) < memsafety_at
    ran = {p.name: [float(t) for t in p.read_text().split()] for p in spans.iterdir()}
    assert set(ran) == {"memcheck", "racecheck", "initcheck"}
    # Each tool's child had its case while correctness items were still to start: sent as the workdir
    # loaded, not when its own item came. (When the tools end depends on the machine's load.)
    last_correctness = max(t for nodeid, t in started.items() if "Correctness" in nodeid)
    assert all(0 < sent < last_correctness for *_, sent in ran.values()), (ran, last_correctness)
    [record] = [r for r in json.loads((pytester.path / "report.json").read_text())["results"]
                if r["kind"] == "memsafety"]
    assert record["data"]["passed"] and record["data"]["tools"] == {t: "clean" for t in ran}


PAUSE_IN_ITEM = """\
import json, os, pathlib, threading, time

import pytest

PAUSE, SEEN = pathlib.Path(os.environ["CUDAOPT_PAUSE"]), pathlib.Path(os.environ["PAUSE_SEEN"])
ended = []


def sanitizers():   # the states of this process's stand-in sanitizer children (T: stopped)
    states = []
    for task in pathlib.Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if b"compute-sanitizer" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                states.append(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    return states


def watch():   # a turn's judge: wait for the answer, look, then let it go on
    deadline = time.time() + 20
    while not (PAUSE / "paused").exists() and time.time() < deadline:
        time.sleep(0.01)
    seen = {"paused": (PAUSE / "paused").exists(), "item_ended": bool(ended), "states": sanitizers()}
    time.sleep(1.0)
    seen["states_later"] = sanitizers()
    SEEN.write_text(json.dumps(seen))
    (PAUSE / "pause").unlink()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):   # asked once the memory-safety item has begun: past its pause point between items
    if "MemorySafety" in item.nodeid:
        (PAUSE / "pause").write_text("4")
        threading.Thread(target=watch, daemon=True).start()


def pytest_runtest_logreport(report):
    if report.when == "call" and "MemorySafety" in report.nodeid:
        ended.append(report.outcome)
"""


def test_a_check_asked_to_pause_while_its_item_waits_on_the_sanitizer_pauses_with_the_sanitizer_stopped(
        pytester, sanitized, monkeypatch, tmp_path):
    """A judge's check child asked to pause (another workdir's turn) while its memory-safety item waits on the
    sanitizer's children pauses then, with those children stopped, not once the item ends (a turn waited for a
    whole sanitizer run, and for ever on one that never ended); let go, the item goes on and passes."""
    path = sanitized()
    pause, seen = tmp_path / "pause", tmp_path / "seen.json"
    pause.mkdir()
    (path / "conftest.py").write_text(PAUSE_IN_ITEM)
    monkeypatch.setenv("CUDAOPT_PAUSE", str(pause))
    monkeypatch.setenv("PAUSE_SEEN", str(seen))
    monkeypatch.setenv("FAKE_SANITIZER_SLEEP_MEMCHECK", "4")   # the item waits on memcheck for seconds
    result = run_pytest(pytester, "wd", "-m", "memsafety", "--cudaopt-report=report.json", "-rA")
    result.assert_outcomes(passed=1)
    assert seen.exists(), "the pause was not answered while the item ran (the session ended first)"
    found = json.loads(seen.read_text())
    assert found["paused"] and not found["item_ended"], found
    assert len(found["states"]) == 3 and set(found["states"]) == {"T"}, found       # the three tools stopped
    assert set(found["states_later"]) == {"T"}, found                                # until let go
    [record] = [r for r in json.loads((pytester.path / "report.json").read_text())["results"]
                if r["kind"] == "memsafety"]
    assert record["data"]["passed"] and record["data"]["tools"] == {t: "clean" for t in record["data"]["tools"]}


def test_a_sanitizer_run_that_never_ends_after_a_pause_is_not_held_against_the_candidate(
        pytester, sanitized, monkeypatch, tmp_path):
    """compute-sanitizer stopped and continued with a paused check may not come back: memcheck past its time after
    a pause is the environment's (exit 75: the judge runs the check again), and says so. Unpaused, the same run
    fails as the candidate's (test_a_memcheck_that_runs_past_its_time_fails...)."""
    path = sanitized(ini="cudaopt_memsafety_timeout = 12\n")
    pause, seen = tmp_path / "pause", tmp_path / "seen.json"
    pause.mkdir()
    (path / "conftest.py").write_text(PAUSE_IN_ITEM)
    monkeypatch.setenv("CUDAOPT_PAUSE", str(pause))
    monkeypatch.setenv("PAUSE_SEEN", str(seen))
    monkeypatch.setenv("FAKE_SANITIZER_SLEEP_MEMCHECK", "60")
    result = run_pytest(pytester, "wd", "-m", "memsafety", "--cudaopt-report=report.json")
    result.assert_outcomes(failed=1)
    assert result.ret == 75, result.stdout.str()[-2000:]
    assert json.loads(seen.read_text())["paused"]
    report = json.loads((pytester.path / "report.json").read_text())
    [item] = [i for i in report["items"] if i["kind"] == "memsafety"]
    assert item["blame"] == "environment" and report["complete"] is False, item
    result.stdout.fnmatch_lines(["*memcheck did not finish within its time*",
                                 "*its sanitized run was paused *s in all for other workdirs' turns beside it*"])


def test_the_item_fails_a_write_past_the_output_naming_the_kernel_line(pytester, sanitized):
    sanitized({"memcheck": SCALE_PAST_END.format(line=scale_line())})
    result = run_pytest(pytester, "wd", "-m", "memsafety", "--cudaopt-report=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*memory safety of *wd on case features=1: kernels/scale.cpp:{scale_line()}: memcheck: Invalid __global__ "
        "write of size 4 bytes in scale_rows(* (PYTORCH_NO_CUDA_MEMORY_CACHING=1; memcheck: 1 finding(s), "
        "racecheck: stopped (memcheck decided), initcheck: stopped (memcheck decided)):",
        f"  kernels/scale.cpp:{scale_line()}: memcheck: Invalid __global__ write of size 4 bytes in scale_rows(*",
    ])
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["passed"] is False
    [data] = [r["data"] for r in report["results"] if r["kind"] == "memsafety"]
    assert data["findings"][0].startswith(f"kernels/scale.cpp:{scale_line()}: memcheck:")
    [item] = [i for i in report["items"] if i["kind"] == "memsafety"]   # the reason names the finding
    assert f"kernels/scale.cpp:{scale_line()}: memcheck: Invalid __global__ write" in item["reason"], item


def test_a_race_fails_the_item_and_leaves_initcheck_to_finish(pytester, sanitized):
    line = scale_line()
    race = (LOGS / "racecheck_shared_race.log").read_text().replace("memsafety.cu:41", f"scale.cpp:{line}") \
        .replace("memsafety.cu:42", f"scale.cpp:{line}")
    sanitized({"racecheck": race})
    result = run_pytest(pytester, "wd", "-m", "memsafety", "--cudaopt-report=report.json")
    result.assert_outcomes(failed=1)
    [data] = [r["data"] for r in json.loads((pytester.path / "report.json").read_text())["results"]]
    assert data["tools"] == {"memcheck": "clean", "racecheck": "1 finding(s)", "initcheck": "clean"}, data
    assert data["findings"][0].startswith(f"kernels/scale.cpp:{line}"), data


def test_plain_init_values_reach_modelnew_alike_through_the_worker_and_the_sanitized_child(pytester, sanitized):
    """A complex and a frozenset among get_init_inputs(): the worker's wire and the sanitized child's
    torch.load read the same plain values, so the correctness and memory-safety items agree."""
    path = sanitized()
    for name in ("model.py", "model_new.py"):
        text = (path / name).read_text().replace("def __init__(self, features: int):",
                                                 "def __init__(self, features: int, tags: frozenset, gain: complex):")
        (path / name).write_text(text.replace("return [features]", 'return [features, frozenset({"a"}), 1 + 0j]'))
    result = run_pytest(pytester, "wd", "-m", "correctness or memsafety", "--cudaopt-seeds=1",
                        "--cudaopt-max-examples=2")
    result.assert_outcomes(passed=3)


# model_new.py variants that tell the sanitized child from a worker (its command line names it) and
# dodge the sanitizer there: no call at all, a forged word of one, torch in place of the kernels.
DODGES = {
    "no_call": ("import os, sys\nif any('sanitized' in a for a in sys.argv):\n    os._exit(0)\n",
                "exited 0 without word of a completed call of ModelNew"),
    "forged_word": ("import os, sys\nif any('sanitized' in a for a in sys.argv):\n"
                    "    print('cudaopt-memsafety-call: {\"audit\": []}', flush=True)\n    os._exit(0)\n",
                    "output under memcheck could not be read back"),
    "torch_fallback": ("import sys\nif any('sanitized' in a for a in sys.argv):\n"
                       "    ModelNew.forward = lambda self, x: x * self.weight + self.bias\n",
                       "ModelNew called torch ops, not its own kernels: model_new.py:20: aten::mul.Tensor"),
}


@pytest.mark.parametrize("dodge", sorted(DODGES))
def test_a_workdir_that_dodges_the_sanitizer_fails_memory_safety(pytester, sanitized, dodge):
    path = sanitized()
    code, said = DODGES[dodge]
    model_new = path / "model_new.py"
    text = model_new.read_text()
    # the no-call and forged dodges go at the top; the fallback patches the class once it exists
    model_new.write_text(text + "\n" + code if dodge == "torch_fallback" else code + text)
    result = run_pytest(pytester, "wd", "-m", "memsafety")
    result.assert_outcomes(failed=1)
    assert said in result.stdout.str(), result.stdout.str()[-3000:]


# NVML's table as the judging process reads it: every other process (the worker among them) holds `held`.
HOLDERS = """
import os

import pytest_cudaopt.primitives.nvml

pytest_cudaopt.primitives.nvml.processes = lambda index=0: [
    {{"pid": int(pid), "used_bytes": {held}}} for pid in os.listdir("/proc") if pid.isdigit() and int(pid) != os.getpid()]
"""


@pytest.mark.parametrize("held, blamed", [(1 << 30, "environment"), (110 << 30, "candidate")])
def test_a_sanitized_case_that_ran_out_of_memory_is_blamed_on_whoever_holds_it(pytester, sanitized, monkeypatch,
                                                                               held, blamed):
    work = sanitized()
    monkeypatch.setenv("FAKE_SANITIZER_OOM", "1")
    (work / "conftest.py").write_text(HOLDERS.format(held=held))   # beside its pytest.ini
    # A correctness case first: the candidate's worker is up, as in a whole run.
    result = run_pytest(pytester, "wd", "-m", "correctness or memsafety", "-k", "seed0 or memory_safety",
                        "--cudaopt-report=report.json")
    report = json.loads((pytester.path / "report.json").read_text())
    [item] = [i for i in report["items"] if i["kind"] == "memsafety"]
    assert item["status"] == "failed" and item["blame"] == blamed, item
    assert report["complete"] is (blamed == "candidate"), report
    text = result.stdout.str()
    assert "the case did not complete under memcheck (exit status 11)" in text and "out of memory" in text
    assert ("holds 110.00 GiB; the workdir's largest case with ModelNew's weights allows" in text) == (blamed == "candidate"), text[-3000:]


def test_a_memcheck_that_runs_past_its_time_fails_and_slow_optional_tools_are_noted(pytester, sanitized, monkeypatch):
    monkeypatch.setenv("FAKE_SANITIZER_SLEEP_MEMCHECK", "30")
    sanitized(ini="cudaopt_memsafety_timeout = 12\n")
    result = run_pytest(pytester, "wd", "-m", "memsafety")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*memcheck did not finish within its time (1? s); raise cudaopt_memsafety_timeout*"])
    # what its processes were doing then: the stand-in sanitizer asleep (S), not stopped (T) by a pause
    result.stdout.fnmatch_lines(["*its processes then: compute-sanitiz S)*"])   # /proc keeps 15 characters of a name


def test_an_optional_tool_still_running_at_the_time_limit_is_a_note_not_a_failure(pytester, sanitized, monkeypatch):
    monkeypatch.setenv("FAKE_SANITIZER_SLEEP_RACECHECK", "60")
    sanitized(ini="cudaopt_memsafety_timeout = 12\n")
    result = run_pytest(pytester, "wd", "-m", "memsafety", "--cudaopt-report=report.json")
    result.assert_outcomes(passed=1)
    [data] = [r["data"] for r in json.loads((pytester.path / "report.json").read_text())["results"]]
    assert data["tools"]["memcheck"] == "clean" and data["tools"]["initcheck"] == "clean", data
    assert data["tools"]["racecheck"].startswith("stopped after 1"), data
    assert any(note.startswith("racecheck was stopped at the time limit") for note in data["notes"]), data
    assert data["seconds"] < 40, data  # the stopped child's group was killed, not waited for


def test_without_compute_sanitizer_the_item_skips_saying_where_it_looked(pytester, sanitized):
    path = sanitized()
    (path / "pytest.ini").write_text("[pytest]\ncudaopt_device = cpu\ncudaopt_compute_sanitizer = /nonexistent/cs\n")
    result = run_pytest(pytester, "wd", "-m", "memsafety", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*compute-sanitizer not found (looked in cudaopt_compute_sanitizer=/nonexistent/cs)*"])


def test_on_the_cpu_device_the_item_skips_and_on_cuda_it_needs_the_gpu(pytester, make_workdir, monkeypatch):
    monkeypatch.delenv("CUDAOPT_SELF_TEST", raising=False)
    path = make_workdir("cpu_scale", dest=pytester.path / "wd")
    (path / "pytest.ini").write_text("[pytest]\ncudaopt_device = cpu\n")
    result = run_pytest(pytester, "wd", "-m", "memsafety", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*cudaopt_device is cpu: the memory-safety item checks CUDA kernels*"])
    (path / "pytest.ini").write_text("[pytest]\ncudaopt_device = cuda\n")
    result = run_pytest(pytester, "wd", "-m", "memsafety", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no CUDA device visible*"])  # the gpu marker's skip


def _case_in(path: Path, scratch: Path, case: dict) -> list:
    """The sanitized case of the workdir at `path` saved in `scratch` as the memory-safety item saves it
    (verdict.begin); model.py's output on it."""
    import torch

    from pytest_cudaopt.candidate.construct import stand_in_extension
    from pytest_cudaopt.candidate.sanitized import CASE
    from pytest_cudaopt.workdir import load_workdir

    sent, want = memsafety.draw_case(load_workdir(path, stand_in_extension()), case, 1, "cpu")
    torch.save(sent, scratch / CASE)
    return want


def test_the_child_runs_one_call_and_says_so(prebuilt_workdir, subprocess_env, tmp_path):
    import subprocess

    import torch

    from pytest_cudaopt.candidate.sanitized import CASE, OUTPUT

    path = prebuilt_workdir("cpu_scale")
    so = next((path / "build" / "cudaopt").glob("*/cuda_extension.so"))
    want = _case_in(path, tmp_path, {"features": 3})
    cmd = memsafety.child_command(path, str(so), str(tmp_path), "cpu")
    done = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == 'cudaopt-memsafety-call: {"audit": []}'
    [got] = torch.load(tmp_path / OUTPUT, weights_only=True)
    assert got.shape == want[0].shape == (16, 3) and torch.allclose(got, want[0].float())
    # What the child imports is the candidate side's alone: it runs beside the candidate's code.
    probe = ("import sys; sys.argv = sys.argv[1:]; from pytest_cudaopt.candidate import sanitized; "
             "code = sanitized.main(sys.argv); "
             "print(sorted(m for m in sys.modules if m.startswith('pytest_cudaopt.')))")
    seen = subprocess.run([cmd[0], "-c", probe, *cmd[3:]], capture_output=True, text=True, env=subprocess_env,
                          timeout=300)
    loaded = eval(seen.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's list of names
    assert "pytest_cudaopt.candidate.sanitized" in loaded, loaded
    assert all(m.partition(".")[2].partition(".")[0] == "candidate" for m in loaded), loaded
    case = torch.load(tmp_path / CASE, weights_only=True)
    torch.save({**case, "init": [-1]}, tmp_path / CASE)  # ModelNew(-1) raises
    bad = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env, timeout=300)
    assert bad.returncode == 3 and "cudaopt memsafety: the case raised" in bad.stderr, bad.stderr


def test_the_child_confines_itself_and_still_runs_its_call(prebuilt_workdir, subprocess_env, tmp_path):
    import subprocess

    from pytest_cudaopt.candidate.sandbox import landlock_abi

    if not landlock_abi()[0]:
        pytest.skip(f"this kernel offers no Landlock: {landlock_abi()[1]}")
    path = prebuilt_workdir("cpu_scale")
    so = next((path / "build" / "cudaopt").glob("*/cuda_extension.so"))
    _case_in(path, tmp_path, {"features": 3})
    cmd = memsafety.child_command(path, str(so), str(tmp_path), "cpu", "require")
    assert cmd[-2:] == ["--sandbox", "require"]
    # What it is not given leave to write: a file beside its workdir, as compute-sanitizer's log is.
    probe = ("import sys; sys.argv = sys.argv[1:]; "
             "from pytest_cudaopt.candidate import sanitized as s; code = s.main(sys.argv); "
             "open(%r, 'w').write('forged')" % str(path.parent / "forged.log"))
    done = subprocess.run([cmd[0], "-c", probe, *cmd[3:]], capture_output=True, text=True, timeout=300,
                          env={**subprocess_env, "TMPDIR": str(tmp_path)})  # as verdict.Sanitized sets it
    assert 'cudaopt-memsafety-call: {"audit": []}' in done.stdout, done.stderr
    assert "PermissionError" in done.stderr and not (path.parent / "forged.log").exists()


def test_children_started_ahead_load_nothing_of_the_workdir_before_their_case_and_end_with_their_parent(
        prebuilt_workdir, tmp_path, monkeypatch):
    """memsafety.Sanitized: started while the workdir loads, each tool's child imports torch and waits; the case
    sent, each makes its call. One whose sanitizer is gone stops waiting."""
    import time

    import torch

    path = prebuilt_workdir("cpu_scale")
    so = next((path / "build" / "cudaopt").glob("*/cuda_extension.so"))
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PYTHONPATH", str(Path(memsafety.__file__).resolve().parents[2]))
    ahead = memsafety.Sanitized(path, str(so), "cpu", "off", str(fake), wait=120)
    try:
        time.sleep(3.0)   # torch imported by now
        assert ahead.waiting()
        for child in ahead.children.values():
            kids = Path(f"/proc/{child.proc.pid}/task/{child.proc.pid}/children").read_text().split()
            assert kids, "the tool's child runs"
            assert str(path) not in Path(f"/proc/{kids[0]}/maps").read_text(), "the workdir's extension loads early"
        want = _case_in(path, tmp_path, {"features": 3})
        ahead.send(torch.load(tmp_path / "memsafety-case.pt", weights_only=True))
        for tool, child in ahead.children.items():
            run = child.finish(lambda: 120.0)
            assert run.returncode == 0 and "cudaopt-memsafety-call:" in run.output, (tool, run.output[-2000:])
            [got] = torch.load(ahead.child_scratch / tool / "memsafety-output.pt", weights_only=True)
            assert torch.allclose(got, want[0].float())
    finally:
        ahead.close()
    orphan = memsafety.Sanitized(path, str(so), "cpu", "off", str(fake), wait=120)
    try:
        time.sleep(1.0)
        child = orphan.children["memcheck"]
        [kid] = Path(f"/proc/{child.proc.pid}/task/{child.proc.pid}/children").read_text().split()
        os.kill(child.proc.pid, signal.SIGKILL)   # its sanitizer gone, the child is no one's to wait for
        deadline = time.monotonic() + 30
        while Path(f"/proc/{kid}").exists() and "Z" not in Path(f"/proc/{kid}/stat").read_text().split()[2] \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert time.monotonic() < deadline, "the orphaned child still waits"
    finally:
        orphan.close()
