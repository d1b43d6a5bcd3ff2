"""`pytest -m perf` end to end on the CPU example workdir: the gate, the table, the JSON report, pytest-benchmark."""

import json
import shutil
import sys
import textwrap

import pytest

from doubles import DOUBLES_PATH
from support import JUDGE_CACHE, JUDGE_CPU_ARGS, run_pytest, run_python, subprocess_env

MS = 1e-3
INI = """\
[pytest]
cudaopt_device = cpu
cudaopt_compile_backend = eager
cudaopt_warmup = 0.01
cudaopt_max_time = 1.0
"""
# The perf items take their clock from the `pytest_cudaopt_perf_clock` hook; this one returns
# scripted durations per contender, so the verdict does not depend on this machine's speed.
FAKE_CLOCK = DOUBLES_PATH + """\
from doubles import FakeClock


def pytest_cudaopt_perf_clock(config, device):
    return FakeClock({durations!r}, escaped={escaped!r}, latency={latency!r})
"""
# A scripted kernel trace per contender (the perf items' `pytest_cudaopt_perf_tracer` hook).
FAKE_TRACER = """
from doubles import FakeTracer
from pytest_cudaopt.perf.trace import Kernel, Trace


def _trace(kernels, calling=7, window=(0.0, 1e-3)):
    return Trace([Kernel(name, stream, start, duration, grid=(64, 1, 1)) for name, stream, start, duration in kernels],
                 calling_stream=calling, window=window)


def pytest_cudaopt_perf_tracer(config, device):
    return FakeTracer({{key: _trace(kernels) for key, kernels in {traces!r}.items()}})
"""


@pytest.fixture
def workdir(pytester, make_workdir, monkeypatch):
    """`workdir(durations=None, escaped=None, latency=None, traces=None)`: the built cpu_scale
    workdir at pytester.path/wd with a CPU ini, a fake clock when durations are given, and
    a fake tracer when traces ({key: [(name, stream, start, duration)]}) are given (both
    allowed by CUDAOPT_SELF_TEST, which the pytest subprocesses inherit)."""
    monkeypatch.setenv("CUDAOPT_SELF_TEST", "1")

    def make(durations=None, escaped=None, latency=None, traces=None):
        path = make_workdir("cpu_scale", dest=pytester.path / "wd")
        (path / "pytest.ini").write_text(INI)
        if durations is not None:
            text = FAKE_CLOCK.format(durations=durations, escaped=escaped or {}, latency=latency or {})
            if traces is not None:
                text += FAKE_TRACER.format(traces=traces)
            (path / "conftest.py").write_text(text)
        return path

    return make


def speeds(custom, compile_, eager=3 * MS, **others):
    return {"custom": custom, "compile": compile_, "eager": eager, **others}


def test_it_passes_a_custom_path_faster_than_torch_compile_and_records_everything(pytester, workdir):
    workdir(speeds(custom=1 * MS, compile_=2 * MS))
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-report=report.json",
                        "--benchmark-json=bench.json", "--benchmark-only")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*= cudaopt summary =*",
        "cudaopt perf: *wd (model_new.py::TestPerf::test_speedup)",
        "contender *device time (gate) *latency *IQR *n *vs eager *vs compile *precision *verdict",
        "Model (eager) *3.00 ms *3.00 ms *0.00 ns *[0-9]* *1.00x *0.67x *fp32 *reference",
        "torch.compile (backend=eager) *2.00 ms *2.00 ms *0.00 ns *[0-9]* *1.50x *1.00x *fp32 *gate baseline",
        "ModelNew (custom) *1.00 ms *1.00 ms *0.00 ns *[0-9]* *3.00x *2.00x *fp32 *PASS (>= 1.05x)",
        "gate: median(ModelNew (custom)) <= median(torch.compile (backend=eager)) / 1.05: "
        "1.00 ms <= 2.00 ms / 1.05 = 1.90 ms: PASS (speedup 2.000x, needed 1.05x)",
        "cudaopt: report written to report.json",
    ])
    doc = json.loads((pytester.path / "report.json").read_text())
    (perf,) = doc["results"]
    assert perf["kind"] == "perf" and perf["passed"] is True
    assert perf["data"]["gate"]["speedup"] == pytest.approx(2.0)
    assert perf["data"]["precision"] == "fp32"
    bench = json.loads((pytester.path / "bench.json").read_text())
    (entry,) = bench["benchmarks"]
    assert entry["name"] == "test_speedup"
    info = entry["extra_info"]
    assert info["speedup_vs_compile"] == pytest.approx(2.0)
    assert info["speedup_vs_eager"] == pytest.approx(3.0)
    assert info["compile_median_s"] == pytest.approx(2 * MS)
    assert info["precision_tier"] == "fp32" and info["gate_passed"] is True
    assert {"gpu", "torch", "cuda"} <= set(info)
    assert entry["stats"]["rounds"] == 50
    assert bench["machine_info"]["gpu"] == "none"
    assert "torch" in bench["machine_info"]


@pytest.mark.parametrize("min_speedup, outcome", [("1.05", "failed"), ("1.02", "passed")])
def test_it_fails_a_custom_path_less_than_min_speedup_faster_with_the_table_as_message(
        pytester, workdir, min_speedup, outcome):
    workdir(speeds(custom=1 * MS, compile_=1.04 * MS))
    result = run_pytest(pytester, "wd", "-m", "perf", f"--cudaopt-min-speedup={min_speedup}")
    result.assert_outcomes(**{outcome: 1})
    if outcome == "failed":
        result.stdout.fnmatch_lines([
            "*FAILED wd/model_new.py::TestPerf::test_speedup*",
        ])
        result.stdout.fnmatch_lines([
            "*ModelNew (custom) *1.00 ms*1.04x*FAIL (< 1.05x)",
            "*FAIL (speedup 1.040x, needed 1.05x)",
        ])
        assert "Traceback" not in result.stdout.str()
        # the summary line carries the gate's reason, and torch's compile trace records stay out
        result.stdout.fnmatch_lines(["  model_new.py::TestPerf::test_speedup: failed: speedup 1.040x is below "
                                     "the required 1.05x"])
        assert "torch.__trace" not in result.stdout.str()


@pytest.mark.parametrize("flag", ["--benchmark-disable", "-p no:benchmark"])
def test_the_gate_runs_without_pytest_benchmark(pytester, workdir, flag):
    workdir(speeds(custom=1 * MS, compile_=1.01 * MS))
    result = run_pytest(pytester, "wd", "-m", "perf", *flag.split())
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*FAIL (speedup 1.010x, needed 1.05x)"])


def test_it_fails_a_candidate_whose_work_escapes_the_measured_stream(pytester, workdir):
    workdir(speeds(custom=0.1 * MS, compile_=2 * MS), escaped={"custom": 1 * MS})
    result = run_pytest(pytester, "wd", "-m", "perf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*ModelNew (custom) *FAIL (see below)",
        "gate: * FAIL, the custom path failed (see below)",
        "ModelNew (custom): work escaped the measured stream: the device stayed busy 1.00 ms "
        "(median of * runs) after the current stream's end event, against 100 us measured on that stream*",
    ])


def test_it_fails_a_candidate_that_replays_cached_outputs_during_timing(pytester, workdir):
    path = workdir(speeds(custom=1 * MS, compile_=2 * MS))
    source = (path / "model_new.py").read_text()
    (path / "model_new.py").write_text(source.replace(
        "        return cuda_extension.scale(x, self.weight, self.bias)",
        textwrap.indent(textwrap.dedent("""\
            # A cheat: the first output for each input tensor is kept and returned again.
            cache = self.__dict__.setdefault("_cache", {})
            if x.data_ptr() not in cache:
                cache[x.data_ptr()] = cuda_extension.scale(x, self.weight, self.bias)
            return cache[x.data_ptr()].clone()"""), " " * 8)))
    result = run_pytest(pytester, "wd", "-m", "perf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ModelNew (custom): output of timed round * (*input set *) differs from the reference*"])


PEERS = """\
from model import Model


def broken(features):
    raise RuntimeError("no such library")


PEERS = {"torch": Model, "broken": broken}
"""


def test_it_times_peers_beside_the_others_without_gating_them(pytester, workdir):
    path = workdir(speeds(custom=1 * MS, compile_=2 * MS, **{"peer:torch": 0.5 * MS}))
    (path / "peers.py").write_text(PEERS)
    result = run_pytest(pytester, "wd", "-m", "perf")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "peer: torch *500 us *500 us *0.00 ns *[0-9]* *6.00x *4.00x *fp32 *not gated",
        "ModelNew (custom) *1.00 ms *PASS (>= 1.05x)",
        "peer:broken: peers.py: PEERS['broken'] failed to build with Model's init arguments [64]: "
        "RuntimeError: no such library",
    ])


def test_it_gates_on_the_precision_matched_baseline_when_asked(pytester, workdir):
    workdir(speeds(custom=1 * MS, compile_=2 * MS, **{"precision-matched": 1.02 * MS}))
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-gate=precision-matched")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*contender *device time (gate) *latency *IQR *n *vs eager *vs compile *vs compile+TF32 *precision *verdict",
        "*torch.compile (backend=eager) + TF32 *1.02 ms *2.94x *1.96x *1.00x *fp32 *gate baseline",
        "*ModelNew (custom) *1.00 ms *3.00x *2.00x *1.02x *fp32 *FAIL (< 1.05x)",
    ])


def test_it_times_the_workdir_with_the_cpu_clock_end_to_end(pytester, workdir):
    workdir()
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-min-speedup=0.001",
                        "--cudaopt-report=report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "contender *device time (gate) *latency *IQR *n *vs eager *vs compile *precision *verdict",
        "ModelNew (custom) * fp32 *PASS (>= 0.001x)",
        "timing: perf-counter, * interleaved rounds (*) in *",
    ])
    doc = json.loads((pytester.path / "report.json").read_text())
    contenders = doc["results"][0]["data"]["timing"]["contenders"]
    assert [c["key"] for c in contenders] == ["eager", "compile", "custom"]
    assert all(c["n"] >= 10 and c["failure"] is None for c in contenders)
    assert all(c["device_median_s"] > 0 and c["latency_median_s"] > 0 for c in contenders)
    assert doc["results"][0]["data"]["traces"] == {}  # no kernel trace on the CPU


def test_cudaopt_profile_prints_the_table_and_exits_non_zero_when_the_gate_fails(pytester, workdir):
    workdir(speeds(custom=1 * MS, compile_=1.0 * MS))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
        result = pytester.run(sys.executable, "-m", "pytest_cudaopt.cli", "profile", "wd")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*ModelNew (custom) *1.00 ms*FAIL (< 1.05x)"])


def test_results_of_pytest_xdist_workers_reach_the_controllers_summary_and_report(pytester, workdir):
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (it is in the test extra)")
    workdir(speeds(custom=1 * MS, compile_=2 * MS))
    result = run_pytest(pytester, "wd", "-m", "correctness or perf", "-n", "2", "-p", "no:randomly",
                        "--cudaopt-report=report.json")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*cudaopt correctness: 4 of 4 passed*", "*ModelNew (custom) *1.00 ms*PASS*"])
    kinds = sorted(r["kind"] for r in json.loads((pytester.path / "report.json").read_text())["results"])
    assert kinds == ["correctness"] * 4 + ["perf"]


def test_the_latency_clock_setting_makes_the_gate_compare_latencies(pytester, workdir):
    # Device time: 2x faster than torch.compile; latency (launches included): slower.
    workdir(speeds(custom=1 * MS, compile_=2 * MS), latency={"custom": 2.5 * MS})
    result = run_pytest(pytester, "wd", "-m", "perf")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "ModelNew (custom) *1.00 ms *2.50 ms *2.00x *PASS (>= 1.05x)",
        "ModelNew (custom): latency 2.50 ms is 2.50x the device time 1.00 ms: launch-bound*",
        "clocks: the gate compares device time.*",
    ])
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-clock=latency")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "contender *device time *latency (gate) *IQR *n *vs eager *vs compile *precision *verdict",
        "ModelNew (custom) *1.00 ms *2.50 ms *0.80x *FAIL (< 1.05x)",
        "*FAIL (speedup 0.800x, needed 1.05x)",
        "clocks: the gate compares latency.*",
    ])


TRACED = {
    "eager": [("void at::native::elementwise_kernel<128>(int)", 7, 0.0, 2e-3)],
    "compile": [("triton_poi_fused_mul_0", 7, 0.0, 1e-3), ("triton_poi_fused_add_1", 7, 1e-3, 0.9e-3)],
}


def test_the_kernel_trace_is_in_the_table_notes_and_report(pytester, workdir):
    traces = dict(TRACED, custom=[("void scale_kernel<float>(float const*)", 7, 0.0, 0.6e-3),
                                  ("side_kernel", 13, 0.1e-3, 0.3e-3)])  # joined: inside the window
    workdir(speeds(custom=1 * MS, compile_=2 * MS), traces=traces)
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-report=report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "contender *device time (gate) *latency *kernel sum *IQR *n *vs eager*",
        "Model (eager) *3.00 ms *3.00 ms *2.00 ms *0.00 ns*",
        "torch.compile (backend=eager) *2.00 ms *2.00 ms *1.90 ms *0.00 ns*",
        "ModelNew (custom) *1.00 ms *1.00 ms *900 us *0.00 ns*PASS*",
        "kernels of ModelNew (custom) (one call: 2 kernels on 2 streams, 900 us): scale_kernel 600 us (67%, grid 64x1x1), "
        "side_kernel 300 us (33%, grid 64x1x1)",
        "kernels of the others (one call): Model (eager) 1 kernel on 1 stream, 2.00 ms; "
        "torch.compile (backend=eager) 2 kernels (2 Triton) on 1 stream, 1.90 ms",
    ])
    data = json.loads((pytester.path / "report.json").read_text())["results"][0]["data"]
    assert sorted(data["traces"]) == ["compile", "custom", "eager"]
    assert data["traces"]["custom"]["kernels"][1]["stream"] == 13
    assert data["traces"]["custom"]["escapes"] == []


def test_a_kernel_left_on_an_unjoined_side_stream_fails_at_any_duration(pytester, workdir):
    # 5 us on stream 13, ending after the calling stream's work continued (the window ends at 1 ms).
    traces = dict(TRACED, custom=[("void scale_kernel<float>(float const*)", 7, 0.0, 0.5e-3),
                                  ("void side_kernel<float>(float*)", 13, 0.999e-3, 5e-6)])
    workdir(speeds(custom=1 * MS, compile_=2 * MS), traces=traces)
    result = run_pytest(pytester, "wd", "-m", "perf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "ModelNew (custom) *FAIL (see below)",
        "ModelNew (custom): work escaped the calling stream (kernel trace): kernel side_kernel, grid 64x1x1 on "
        "stream 13 (calling stream 7, 5.00 us) ended 4.00 us after the calling stream's work had continued past "
        "the call: it was not joined back before the call returned; launch on torch.cuda.current_stream()*",
    ])


def test_the_trace_setting_turns_the_kernel_trace_off(pytester, workdir):
    workdir(speeds(custom=1 * MS, compile_=2 * MS), traces=dict(TRACED, custom=[("k", 13, 0.0, 2e-3)]))
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-no-trace")
    result.assert_outcomes(passed=1)
    assert "kernel sum" not in result.stdout.str()


def test_a_workdir_conftest_cannot_replace_the_perf_clock_without_the_self_test_setting(
        pytester, workdir, monkeypatch):
    workdir(speeds(custom=1 * MS, compile_=2 * MS))
    monkeypatch.delenv("CUDAOPT_SELF_TEST")
    result = run_pytest(pytester, "wd", "-m", "perf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the hook pytest_cudaopt_perf_clock decides the verdict and is implemented in "
                                 "*wd*conftest.py:*; a workdir cannot replace it*"])
    # A conftest.py that sets the variable itself is too late: the plugin read it at load.
    conftest = pytester.path / "wd" / "conftest.py"
    conftest.write_text("import os\nos.environ['CUDAOPT_SELF_TEST'] = '1'\n" + conftest.read_text())
    run_pytest(pytester, "wd", "-m", "perf").assert_outcomes(failed=1)
    run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-self-test").assert_outcomes(passed=1)


def test_a_custom_far_slower_than_torch_compile_fails_untimed_in_pytest_and_says_by_how_much(pytester, workdir):
    workdir(speeds(custom=40 * MS, compile_=2 * MS))
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-report=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*far slower than torch.compile*: the fastest of its last * warm-up calls took "
                                 "40.0 ms, more than 10x the slowest of the baseline's (2.00 ms); not timed further*"])
    (perf,) = json.loads((pytester.path / "report.json").read_text())["results"]
    custom = next(c for c in perf["data"]["timing"]["contenders"] if c["key"] == "custom")
    assert custom["n"] == 0 and custom["warmup_runs"] >= 3 and custom["untimed"] is True
    again = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-far-slower=0")   # timed in full
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*speedup 0.050x is below the required 1.05x*"])


def test_pytest_xdist_workers_use_the_seed_the_controller_printed(pytester, workdir):
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (it is in the test extra)")
    workdir()
    (pytester.path / "wd" / "conftest.py").write_text(
        "from pytest_cudaopt import plugin\n"
        "def pytest_runtest_setup(item):\n"
        "    print(f'WORKER-SEED {item.config.stash[plugin.SESSION_KEY].seed}')\n")
    result = run_pytest(pytester, "wd", "-m", "correctness", "-n", "2", "-p", "no:randomly", "-rA",
                        "--cudaopt-report=report.json")
    result.assert_outcomes(passed=4)
    seed = json.loads((pytester.path / "report.json").read_text())["seed"]
    header = [line for line in result.outlines if line.startswith("cudaopt: seed ")]
    assert header == [f"cudaopt: seed {seed} (replay with --cudaopt-seed={seed}), device cpu, "
                      "hypothesis profile ci"]
    worker_seeds = {line.split()[-1] for line in result.outlines if line.startswith("WORKER-SEED ")}
    assert worker_seeds == {str(seed)}


# A timing function replaced by model_new.py is replaced in the workdir's worker: the judging
# process's clocks are its own, and the verdict is the honest one (here: slower than compile),
# whether the command line names the workdir or collection finds it.
@pytest.mark.parametrize("replaced, args", [
    ("time.perf_counter", ["wd"]),
    ("time.perf_counter", [".", "-o", "cudaopt_device=cpu", "-o", "cudaopt_compile_backend=eager",
                           "-o", "cudaopt_warmup=0.01", "-o", "cudaopt_max_time=1.0"]),
    ("torch.cuda.synchronize", ["wd"]),
], ids=["perf_counter-named", "perf_counter-collected", "synchronize-named"])
def test_a_timing_function_replaced_by_model_new_moves_no_verdict(pytester, workdir, replaced, args):
    path = workdir(speeds(custom=3 * MS, compile_=2 * MS))
    owner, name = replaced.rsplit(".", 1)
    model_new = path / "model_new.py"
    model_new.write_text(model_new.read_text() + f"\nimport {owner.split('.')[0]}\n{owner}.{name} = lambda *a: 0.0\n")
    result = run_pytest(pytester, *args, "-m", "perf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*speedup 0.667x is below the required 1.05x*"])
    result.stdout.no_fnmatch_line("*were replaced*")


# -- every timed call on inputs no earlier call saw -----------------------------------------------

MEMO_CLOCK = DOUBLES_PATH + """\
from pathlib import Path

from doubles import FakeClock


def _hits():
    for name, module in list(sys.modules.items()):
        if name.endswith(".model_new") and hasattr(module, "cuda_extension"):
            return module.cuda_extension.memo_hits()
    return 0


class _Charge:
    \"\"\"The custom path's figure: 0.1 ms for a call its memo answered, else the naive kernel's 8 ms.\"\"\"

    def __init__(self):
        self.seen = 0

    def __call__(self):
        now = _hits()
        hit, self.seen = now > self.seen, now
        return 0.1e-3 if hit else 8e-3


def pytest_cudaopt_perf_clock(config, device):
    return FakeClock({"eager": 3e-3, "compile": 1e-3, "custom": _Charge()})


def pytest_sessionfinish(session):
    Path(session.config.rootpath, "hits.txt").write_text(str(_hits()))
"""


def test_a_memo_keyed_by_input_content_never_hits_and_fails_the_gate_at_its_honest_speed(
        pytester, make_workdir, monkeypatch):
    # KernelBench level1/1 in small: a naive matmul behind a memo of eight sampled input elements.
    monkeypatch.setenv("CUDAOPT_SELF_TEST", "1")
    path = make_workdir("cpu_problems", dest=pytester.path / "wd")
    for name, source in (("model.py", "model.py"), ("model_new.py", "content_memo.py")):
        (path / name).write_text((path / "variants" / "matmul" / source).read_text())
    (path / "pytest.ini").write_text(INI)
    (path / "conftest.py").write_text(MEMO_CLOCK)
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-report=report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["ModelNew (custom) *8.00 ms *8.00 ms *FAIL (< 1.05x)",
                                 "*FAIL (speedup 0.125x, needed 1.05x)"])
    assert (pytester.path / "wd" / "hits.txt").read_text() == "0"
    timing = json.loads((pytester.path / "report.json").read_text())["results"][0]["data"]["timing"]
    custom = next(c for c in timing["contenders"] if c["key"] == "custom")
    assert custom["min_s"] == pytest.approx(8e-3) and custom["failure"] is None
    # a set for each call of the three contenders: their batches (n samples) and a latency run a round
    assert timing["inputs_drawn"] >= 3 * (custom["n"] + timing["rounds"])


IN_PLACE_MODEL = '''\
"""y = x * weight + bias, computed in x's own storage (KernelBench models do this)."""

import torch
import torch.nn as nn

batch_size = 16
features = 64


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(self.weight).add_(self.bias)
        return x


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
'''


def test_a_reference_that_writes_into_its_input_does_not_fail_a_correct_candidate(pytester, workdir):
    path = workdir(speeds(custom=1 * MS, compile_=2 * MS))
    (path / "model.py").write_text(IN_PLACE_MODEL)
    result = run_pytest(pytester, "wd", "-m", "correctness or perf", "-p", "no:randomly")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["Model (eager) *3.00 ms*reference", "ModelNew (custom) *1.00 ms*PASS (>= 1.05x)"])
    assert "differs from the reference" not in result.stdout.str()


HALF_OFF_CANONICAL = '''\
"""Exact at the canonical size (16 x 64), rounded to bfloat16 everywhere else."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 16 and x.shape[1] == 64:
            return cuda_extension.scale(x, self.weight, self.bias)
        return cuda_extension.scale_bf16(x, self.weight, self.bias)
'''


def _half_off_canonical(pytester, make_workdir, monkeypatch) -> None:
    """HALF_OFF_CANONICAL in the cheat_kernels workdir at pytester's wd/, under a scripted clock that passes it."""
    monkeypatch.setenv("CUDAOPT_SELF_TEST", "1")
    path = make_workdir("cheat_kernels", dest=pytester.path / "wd")
    (path / "model_new.py").write_text(HALF_OFF_CANONICAL)
    (path / "pytest.ini").write_text(INI)
    (path / "conftest.py").write_text(FAKE_CLOCK.format(
        durations=speeds(custom=1 * MS, compile_=2 * MS, **{"precision-matched": 1.5 * MS}), escaped={}, latency={}))


def test_the_perf_verdict_names_the_workdirs_worst_tier_and_on_the_cpu_times_no_tf32_baseline(
        pytester, make_workdir, monkeypatch):
    _half_off_canonical(pytester, make_workdir, monkeypatch)
    result = run_pytest(pytester, "wd", "-m", "correctness or perf", "-p", "no:randomly",
                        "--cudaopt-report=report.json")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([
        "ModelNew (custom) *1.00 ms *half-like *PASS (>= 1.05x)",
        "precision of ModelNew (custom): half-like: * on drawn shapes (* cases), the least precise of 4 "
        "correctness results of this workdir; on the timed inputs fp32: *",
    ])
    assert "TF32" not in result.stdout.str()   # a CPU has none: on CUDA this tier adds torch.compile + TF32
    perf = next(r["data"] for r in json.loads((pytester.path / "report.json").read_text())["results"]
                if r["kind"] == "perf")
    assert perf["precision"] == "half-like" and "precision-matched" not in perf["tiers"]
    assert perf["gate"]["baseline"] == "compile"


REVERSED = """
def pytest_collection_modifyitems(items):   # as a reordering plugin (pytest-randomly, --ff, --nf) may
    items.reverse()
"""


@pytest.mark.parametrize("reorder", ["plugin", "--ff"])
def test_in_any_order_of_the_items_the_perf_item_runs_after_its_workdirs_correctness_items(
        pytester, make_workdir, monkeypatch, reorder):
    """A reordering plugin (pytest-randomly; here one that reverses the items) or option (`--ff` with the perf item
    failed last time: pytest moves it first after every other plugin's reordering) must not run the perf item before
    the correctness items whose precision bounds its timed outputs: it would not see them, and a candidate that
    computes less when only timed calls come would go unchecked."""
    _half_off_canonical(pytester, make_workdir, monkeypatch)
    if reorder == "plugin":
        with open(pytester.path / "wd" / "conftest.py", "a") as conftest:
            conftest.write(REVERSED)
    else:
        cache = pytester.path / "wd" / ".pytest_cache" / "v" / "cache"
        cache.mkdir(parents=True)
        (cache / "lastfailed").write_text(json.dumps({"model_new.py::TestPerf::test_speedup": True}))   # rootdir: wd
    result = run_pytest(pytester, "wd", "-m", "correctness or perf", "-p", "no:randomly", "-v",
                        *(["--ff"] if reorder == "--ff" else []), cache=reorder == "--ff")
    result.assert_outcomes(passed=5)
    ran = [line.split(" ")[0] for line in result.stdout.lines if line.startswith("wd/model_new.py::")]
    assert len(ran) == 5 and ran[-1].endswith("TestPerf::test_speedup"), ran
    result.stdout.fnmatch_lines(["precision of ModelNew (custom): half-like: * on drawn shapes (* cases), the least "
                                 "precise of 4 correctness results of this workdir; on the timed inputs fp32: *"])


def test_a_perf_run_given_a_correctness_report_finds_the_tier_a_whole_session_finds(pytester, make_workdir, monkeypatch):
    """`cudaopt judge` runs correctness and perf in two processes, and names the first's report to the second."""
    _half_off_canonical(pytester, make_workdir, monkeypatch)
    run_pytest(pytester, "wd", "-m", "correctness", "-p", "no:randomly", "--cudaopt-report=check.json")
    alone = run_pytest(pytester, "wd", "-m", "perf", "-p", "no:randomly", "--cudaopt-report=alone.json")
    alone.stdout.fnmatch_lines(["ModelNew (custom) *1.00 ms *fp32 *PASS (>= 1.05x)"])   # the canonical size only
    result = run_pytest(pytester, "wd", "-m", "perf", "-p", "no:randomly", "--cudaopt-report=perf.json",
                        "--cudaopt-correctness-report=check.json")
    result.stdout.fnmatch_lines([
        "ModelNew (custom) *1.00 ms *half-like *PASS (>= 1.05x)",
        "precision of ModelNew (custom): half-like: * on drawn shapes (* cases), the least precise of 4 "
        "correctness results of this workdir; on the timed inputs fp32: *",
    ])
    broken = run_pytest(pytester, "wd", "-m", "perf", "-p", "no:randomly", "--cudaopt-correctness-report=nowhere.json")
    broken.assert_outcomes(failed=1)
    assert "cudaopt_correctness_report: nowhere.json is not a readable cudaopt JSON report" in broken.stdout.str()


@pytest.mark.parametrize("dist", ["load", "worksteal", "loadgroup", "loadscope"])
def test_under_pytest_xdist_the_perf_item_runs_after_its_workdirs_canonical_items_on_their_worker(
        pytester, make_workdir, monkeypatch, dist):
    """`pytest -n` sends the perf item where the 3 canonical items ran (their precision bounds its timed outputs),
    under each distribution that spreads items one by one; the drawn shapes' item goes elsewhere, so the tier is
    theirs (fp32), not the drawn shapes'."""
    _half_off_canonical(pytester, make_workdir, monkeypatch)
    result = run_pytest(pytester, "wd", "-m", "correctness or perf", "-p", "no:randomly", "-p", "xdist", "-n", "2",
                        f"--dist={dist}", "--cudaopt-report=report.json")
    result.assert_outcomes(passed=5)
    perf = next(r["data"] for r in json.loads((pytester.path / "report.json").read_text())["results"]
                if r["kind"] == "perf")
    assert "(the 3 correctness results of this workdir are no less precise)" in perf["precision_note"], perf


def test_the_judges_perf_stage_finds_the_workdirs_tier_from_its_check_stage(tmp_path, make_workdir):
    """The workdir above judged by `cudaopt judge` (correctness and perf in two processes): its perf result names the
    half-like tier of the correctness items, as `pytest` alone does, not the timed inputs' fp32."""
    path = make_workdir("cheat_kernels", dest=tmp_path / "wd")
    (path / "model_new.py").write_text(HALF_OFF_CANONICAL)
    shutil.rmtree(path / "build", ignore_errors=True)
    out = tmp_path / "lines.jsonl"
    done = run_python(["-m", "pytest_cudaopt.cli", "judge", str(path), "--cpu-slots", "1", "--jobs", "1",
                       "--cache-dir", str(JUDGE_CACHE), "--out", str(out), "--scratch", str(tmp_path / "scratch"),
                       "--all-stages", "--", *JUDGE_CPU_ARGS], cwd=tmp_path, timeout=900)
    [line] = [json.loads(raw) for raw in out.read_text().splitlines()]
    assert line["verdicts"]["correctness"] == "pass", (line["reason"], done.stdout[-2000:], done.stderr[-2000:])
    [perf] = [r["data"] for r in line["report"]["results"] if r["kind"] == "perf"]
    assert perf["precision"] == "half-like", perf["precision_note"]
    assert "correctness results of this workdir; on the timed inputs fp32" in perf["precision_note"]


FAST_CPU = ("--cudaopt-compile-backend=eager", "--cudaopt-max-time=1", "--cudaopt-warmup=0.1",
            "--cudaopt-min-runs=5", "--cudaopt-max-examples=3", "--cudaopt-seeds=1")


def test_with_correctness_and_perf_asked_the_perf_item_of_a_wrong_kernel_is_not_run_and_prints_no_speedup(
        pytester, cheat):
    cheat("returns_input")   # wrong on every case
    result = run_pytest(pytester, "wd", "-m", "correctness or perf", "--cudaopt-report=report.json",
                        "-p", "no:randomly", *FAST_CPU)
    result.stdout.fnmatch_lines(["*test_speedup*not run: correctness failed (wd/model_new.py::*"])
    assert "vs compile" not in result.stdout.str() and "ModelNew (custom)" not in result.stdout.str()
    report = json.loads((pytester.path / "report.json").read_text())
    [perf] = [i for i in report["items"] if i["test"].endswith("test_speedup")]
    assert perf["status"] == "not run" and report["passed"] is False
    assert not any(r["kind"] == "perf" for r in report["results"])   # nothing timed, nothing recorded


def test_on_the_cpu_a_kernel_below_fp32_is_timed_without_a_tf32_baseline_which_exists_only_on_cuda(
        pytester, cheat):
    cheat("bf16")   # bfloat16 arithmetic: below the fp32 tier, where a GPU run adds torch.compile + TF32
    result = run_pytest(pytester, "wd", "-m", "perf", "-p", "no:randomly", *FAST_CPU)
    out = result.stdout.str()
    assert "ModelNew (custom)" in out and "half-like" in out, out
    assert "TF32" not in out


WORKER_STARTS = """\
import time
from pytest_cudaopt.remote import workers

_start = workers.Workers.start


def start(self, *args, **kwargs):
    worker = _start(self, *args, **kwargs)
    with open({log!r}, "a") as handle:
        handle.write(f"{{time.time()}} {{worker.proc.pid}}\\n")
    return worker


workers.Workers.start = start
"""


def test_a_judges_perf_child_makes_its_candidate_before_its_turn_and_waits_with_its_worker_stopped(
        pytester, workdir, monkeypatch):
    """All but the timing is made beside other stages; while it waits for its turn its worker (the candidate's
    code) is stopped, so nothing of the candidate's runs beside another workdir's turn; granted, it times."""
    import threading
    import time
    from pathlib import Path

    path = workdir()
    starts = pytester.path / "starts.txt"
    (path / "conftest.py").write_text(WORKER_STARTS.format(log=str(starts)))
    folder = pytester.path / "turn"
    folder.mkdir()
    monkeypatch.setenv("CUDAOPT_TURN", str(folder))
    seen: list = []

    def judge_side():
        try:
            deadline = time.monotonic() + 120
            while not (folder / "want").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)
            pids = [line.split()[1] for line in starts.read_text().splitlines()] if starts.exists() else []
            seen.append(pids)
            seen.append([Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] for pid in pids])
        finally:
            (folder / "go").touch()

    thread = threading.Thread(target=judge_side, daemon=True)
    thread.start()
    result = run_pytest(pytester, "wd", "-m", "perf", "--cudaopt-min-speedup=0.001", "--cudaopt-report=report.json")
    thread.join(timeout=10)
    assert seen[0], "its worker started (and ModelNew was made) before it asked for its turn"
    assert set(seen[1]) == {"T"}, seen   # stopped while it waits
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "report.json").read_text())
    assert "compile" in doc["results"][0]["data"]["compile_seconds"]   # compiled before the turn, timed after


def test_a_cuda_feed_gives_the_default_pools_cache_back_where_the_next_set_would_not_fit(monkeypatch):
    """The perf inputs live in the worker's sharing pool, whose own out-of-memory retry frees only that pool's
    cache: before each draw, the device must have twice the last set free outside this process's default pool
    (`memory.make_room(device, need)` releases that pool where it has not)."""
    import contextlib

    import torch

    from pytest_cudaopt.perf import verdict

    asked = []
    monkeypatch.setattr(verdict.memory, "make_room", lambda device, need: asked.append((str(device), need)))

    class Workdir:
        def inputs(self, seed, device, isolated):
            return [torch.ones(256), torch.ones(128)]   # 1,536 bytes a set

    class Candidate:
        def sharing(self):
            return contextlib.nullcontext()

    feed = verdict._feed(Workdir(), None, Candidate(), 7, torch.device("cuda", 0))
    feed.next()
    feed.next()
    assert asked == [("cuda:0", 0), ("cuda:0", 2 * 1536)]
    asked.clear()
    verdict._feed(Workdir(), None, Candidate(), 7, torch.device("cpu")).next()
    assert asked == []   # the host has no such pools


@pytest.mark.parametrize("dist, grouped", [
    ("load", ["tests/test_a.py::TestX::test_one", "tests/test_a.py::TestX::test_two@g"]),
    ("worksteal", ["tests/test_a.py::TestX::test_one", "tests/test_a.py::TestX::test_two@g"]),
    ("loadgroup", ["tests/test_a.py::TestX::test_one", "g"]),
    ("loadscope", ["tests/test_a.py::TestX", "tests/test_a.py::TestX"]),
])
def test_the_xdist_scheduler_keeps_a_workdirs_perf_and_canonical_items_and_sends_other_items_as_its_distribution(
        dist, grouped):
    from types import SimpleNamespace

    from pytest_cudaopt.suite.scheduling import scheduler

    config = SimpleNamespace(getvalue=lambda name: {"dist": dist, "tx": ["2*popen"]}[name])
    split = scheduler(config, None)._split_scope
    workdir = ["wd/model_new.py::TestPerf::test_speedup", "wd/model_new.py::TestCorrectness::test_canonical[seed0]"]
    assert {split(nodeid) for nodeid in workdir} == {"cudaopt-workdir:wd/model_new.py"}
    drawn = "wd/model_new.py::TestCorrectness::test_drawn_shapes"
    assert split(drawn) == ("wd/model_new.py::TestCorrectness" if dist == "loadscope" else drawn)
    assert [split(n) for n in ("tests/test_a.py::TestX::test_one", "tests/test_a.py::TestX::test_two@g")] == grouped
    assert scheduler(SimpleNamespace(getvalue=lambda name: "loadfile"), None) is None
