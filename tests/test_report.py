"""The gate's arithmetic and the report formats: terminal table, JSON, Markdown, `cudaopt report`."""

import json
from dataclasses import dataclass

import pytest
import torch

from pytest_cudaopt.results import jsonreport, report, records as results
from pytest_cudaopt.results.ledger import Ledger
from pytest_cudaopt.cli import main as cli_main
from pytest_cudaopt.perf import clocks, decision as gate
from pytest_cudaopt.perf.engine import Config, Contender, measure
from pytest_cudaopt.perf.feed import Feed
from pytest_cudaopt.perf.decision import gate_verdict
from pytest_cudaopt.perf.trace import Kernel, Trace
from pytest_cudaopt.results.records import PerfResult
from doubles import FakeClock

MS = 1e-3


# -- the gate --------------------------------------------------------------------------------

def test_the_gate_passes_when_custom_is_at_most_compile_over_min_speedup():
    v = gate_verdict({"custom": 1.0 * MS, "compile": 1.2 * MS, "eager": 3 * MS}, {}, min_speedup=1.05)
    assert v.passed and v.baseline == "compile"
    assert v.speedup == pytest.approx(1.2)
    assert v.limit == pytest.approx(1.2 * MS / 1.05)


def test_the_gate_fails_below_min_speedup_and_says_by_how_much():
    v = gate_verdict({"custom": 1.0 * MS, "compile": 1.04 * MS}, {}, min_speedup=1.05)
    assert not v.passed
    assert v.reason == "speedup 1.040x is below the required 1.05x"


def test_the_gate_boundary_is_inclusive():
    # 1.5 / 1.5 == 1.0 exactly in binary floating point.
    assert gate_verdict({"custom": 1.0, "compile": 1.5}, {}, min_speedup=1.5).passed
    assert not gate_verdict({"custom": 1.0000001, "compile": 1.5}, {}, min_speedup=1.5).passed


def test_the_gate_can_compare_with_the_precision_matched_baseline():
    medians = {"custom": 1.0 * MS, "compile": 2.0 * MS, "precision-matched": 1.02 * MS}
    assert gate_verdict(medians, {}, gate="compile").passed
    v = gate_verdict(medians, {}, gate="precision-matched")
    assert not v.passed and v.baseline == "precision-matched"
    with pytest.raises(ValueError, match="unknown gate"):
        gate_verdict(medians, {}, gate="eager")


def test_the_gate_fails_when_the_custom_path_or_its_baseline_failed_or_was_not_timed():
    medians = {"custom": 1.0 * MS, "compile": 2.0 * MS}
    v = gate_verdict(medians, {"custom": "work escaped the measured stream"})
    assert not v.passed and v.reason == "the custom path failed: work escaped the measured stream"
    v = gate_verdict(medians, {"compile": "torch.compile failed: no C++ compiler"})
    assert not v.passed and "the gate's baseline failed: torch.compile failed" in v.reason
    assert "not timed" in gate_verdict({"compile": 2.0 * MS}, {}).reason
    assert "'compile' was not timed" in gate_verdict({"custom": 1.0 * MS}, {}).reason


def test_the_gate_description_shows_the_arithmetic():
    v = gate_verdict({"custom": 1.0 * MS, "compile": 2.1 * MS}, {}, min_speedup=1.05)
    text = report.describe_gate(v, {"custom": "ModelNew (custom)", "compile": "torch.compile"})
    assert text == ("gate: median(ModelNew (custom)) <= median(torch.compile) / 1.05: "
                    "1.00 ms <= 2.10 ms / 1.05 = 2.00 ms: PASS (speedup 2.100x, needed 1.05x)")


# -- the perf result -------------------------------------------------------------------------

def perf_result(custom=1.0 * MS, compile_=1.5 * MS, eager=3.0 * MS, tf32=None, escaped=0.0, min_speedup=1.05,
                latency=None, traces=None, gate_clock="device", clock_name="fake"):
    durations = {"eager": eager, "compile": compile_, "custom": custom}
    keys = ["eager", "compile"] + (["precision-matched"] if tf32 else []) + ["custom"]
    if tf32:
        durations["precision-matched"] = tf32
    labels = {"eager": "Model (eager)", "compile": "torch.compile", "precision-matched": "torch.compile + TF32",
              "custom": "ModelNew (custom)"}
    clock = FakeClock(durations, escaped={"custom": escaped}, latency=latency)
    m = measure([Contender(k, lambda x: x, labels[k]) for k in keys], Feed(lambda n: [torch.ones(2)]), clock=clock,
                config=Config(warmup=0.0, min_warmup_runs=1, min_runs=10, clock=gate_clock))
    m.clock = clock_name
    failures = {k: r.failure for k, r in m.results.items() if r.failure}
    verdict = gate_verdict({k: r.summary.median for k, r in m.results.items()}, failures,
                           gate="precision-matched" if tf32 else "compile", min_speedup=min_speedup)
    result = PerfResult(workdir="/w/attn", test="model_new.py::TestPerf::test_speedup", gate=verdict, measurement=m,
                        labels=labels, tiers={"eager": "fp32", "compile": "fp32", "precision-matched": "fp32",
                                              "custom": "tf32-like" if tf32 else "fp32"},
                        compile_seconds={"compile": 12.34}, traces=traces or {},
                        environment={"gpu": "NVIDIA H200", "gpu_capability": "sm_90", "torch": "2.11", "cuda": "13.0"})
    result.figure_warnings = gate.candidate_warnings(m, result.kernel_sum("custom"))
    return result


def test_perf_rows_show_median_iqr_n_speedups_precision_and_verdict():
    rows = report.perf_rows(perf_result())
    assert [r["contender"] for r in rows] == ["Model (eager)", "torch.compile", "ModelNew (custom)"]
    custom = rows[-1]
    assert custom == {"contender": "ModelNew (custom)", "device time (gate)": "1.00 ms", "latency": "1.00 ms",
                      "IQR": "0.00 ns", "n": "10", "vs eager": "3.00x", "vs compile": "1.50x", "precision": "fp32",
                      "verdict": "PASS (>= 1.05x)"}
    assert rows[0]["verdict"] == "reference" and rows[0]["vs eager"] == "1.00x"
    assert rows[1]["verdict"] == "gate baseline" and rows[1]["vs compile"] == "1.00x"


def test_a_slow_custom_path_fails_and_its_table_says_why():
    result = perf_result(custom=1.45 * MS)
    assert not result.passed
    assert report.perf_rows(result)[-1]["verdict"] == "FAIL (< 1.05x)"
    text = report.perf_table(result)
    lines = text.splitlines()
    assert lines[0] == "cudaopt perf: /w/attn (model_new.py::TestPerf::test_speedup)"
    assert lines[1].split() == ["contender", "device", "time", "(gate)", "latency", "IQR", "n", "vs", "eager",
                                "vs", "compile", "precision", "verdict"]
    assert "FAIL (speedup 1.034x, needed 1.05x)" in text
    assert "compile time (first call, not in the medians): torch.compile 12.3 s" in text
    assert "environment: NVIDIA H200 (sm_90), torch 2.11, CUDA 13.0" in text


def test_an_escaping_custom_path_fails_with_its_reason_in_the_notes():
    result = perf_result(custom=0.1 * MS, escaped=1.0 * MS)
    assert not result.passed
    assert report.perf_rows(result)[-1]["verdict"] == "FAIL (see below)"
    assert "ModelNew (custom): work escaped the measured stream" in report.perf_table(result)
    assert ": FAIL, the custom path failed (see below)" in report.perf_table(result)


def test_a_baseline_that_could_not_be_compiled_is_a_row_and_fails_the_gate():
    m = measure([Contender(k, lambda x: x, k) for k in ("eager", "custom")], Feed(lambda n: [torch.ones(2)]),
                clock=FakeClock({"eager": 3 * MS, "custom": MS}), config=Config(warmup=0.0, min_warmup_runs=1))
    errors = {"compile": "torch.compile failed: InvalidCxxCompiler: no working C++ compiler found",
              "peer:*": "peers.py: import failed: SyntaxError: invalid syntax"}
    gate = gate_verdict({k: r.summary.median for k, r in m.results.items()}, errors)
    result = PerfResult(workdir="w", test="t", gate=gate, measurement=m, labels={"compile": "torch.compile"},
                        errors=errors)
    assert not result.passed
    rows = {r["contender"]: r for r in report.perf_rows(result)}
    assert list(rows) == ["eager", "custom", "torch.compile"]
    assert rows["torch.compile"]["device time (gate)"] == "-" and rows["torch.compile"]["n"] == "0"
    assert rows["torch.compile"]["verdict"] == "error (see below)"
    assert rows["custom"]["vs compile"] == "-"
    text = report.perf_table(result)
    assert "gate: median(custom) <= median(torch.compile) / 1.05: FAIL, the gate's baseline failed" in text
    assert "\npeers.py: import failed: SyntaxError: invalid syntax" in text


def test_the_precision_matched_column_appears_only_when_that_baseline_ran():
    assert "vs compile+TF32" not in report.perf_rows(perf_result())[0]
    result = perf_result(custom=1.0 * MS, compile_=2.0 * MS, tf32=1.2 * MS)
    rows = {r["contender"]: r for r in report.perf_rows(result)}
    assert rows["ModelNew (custom)"]["vs compile+TF32"] == "1.20x"
    assert rows["ModelNew (custom)"]["precision"] == "tf32-like"
    assert rows["torch.compile + TF32"]["verdict"] == "gate baseline"
    assert rows["torch.compile"]["verdict"] == "baseline"


def test_extra_info_carries_medians_speedups_gpu_versions_and_precision():
    info = report.benchmark_extra_info(perf_result())
    assert info["custom_median_s"] == pytest.approx(1.0 * MS)
    assert info["compile_median_s"] == pytest.approx(1.5 * MS)
    assert info["eager_median_s"] == pytest.approx(3.0 * MS)
    assert info["speedup_vs_compile"] == pytest.approx(1.5)
    assert info["speedup_vs_eager"] == pytest.approx(3.0)
    assert (info["gpu"], info["torch"], info["cuda"], info["precision_tier"]) == ("NVIDIA H200", "2.11", "13.0", "fp32")
    assert info["compile_seconds"] == 12.34 and info["gate_passed"] is True
    json.dumps(info)


# -- rendering of any result kind ------------------------------------------------------------

@dataclass
class Checked:
    """A result of another kind, as the correctness verdict appends them."""

    case: str
    passed: bool
    kind: str = "correctness"

    def row(self):
        return {"case": self.case, "max abs err": "1.2e-06", "verdict": "pass" if self.passed else "FAIL"}

    def to_json(self):
        return {"case": self.case, "passed": self.passed}


def test_results_of_other_kinds_render_as_one_table_per_kind():
    text = report.render_records([report.record(r) for r in
                                  (Checked("canonical seed0", True), Checked("drawn shapes", False))])
    lines = text.splitlines()
    assert lines[0] == "cudaopt correctness: 1 of 2 passed"
    assert lines[1].split() == ["case", "max", "abs", "err", "verdict"]
    assert lines[3].split() == ["canonical", "seed0", "1.2e-06", "pass"]
    assert lines[4].split() == ["drawn", "shapes", "1.2e-06", "FAIL"]


def test_correctness_tables_come_before_perf_tables():
    records = [report.record(perf_result()), report.record(Checked("canonical seed0", True))]
    text = report.render_records(records)
    assert text.index("cudaopt correctness") < text.index("cudaopt perf")


def test_markdown_tables_have_a_header_rule_and_right_aligned_numbers():
    text = report.render_rows([{"name": "a|b", "median": "1.00 ms"}], title="T", notes=["note"], fmt="markdown")
    assert text.splitlines() == ["### T", "", "| name | median |", "|---|---:|", "| a\\|b | 1.00 ms |", "",
                                 "- note"]


def write_report(path, results, **kwargs):
    """The JSON report of `results`, each the outcome of an item of its kind that ran."""
    ledger = Ledger()
    for i, result in enumerate(results):
        test = getattr(result, "test", None) or f"wd/model_new.py::Test::test_{i}"
        ledger.report(test, result.kind, "/w", "call", "passed" if result.passed else "failed", "")
    return jsonreport.write_json(path, jsonreport.document(ledger.account(results), results, **kwargs))


def test_the_json_report_renders_back_to_the_same_tables(tmp_path):
    results = [perf_result(), Checked("canonical seed0", True)]
    path = write_report(tmp_path / "sub" / "report.json", results, seed=1234, settings={"min_speedup": 1.05})
    doc = json.loads(path.read_text())
    assert doc["schema"] == jsonreport.SCHEMA and doc["seed"] == 1234 and doc["passed"] is True
    assert [r["kind"] for r in doc["results"]] == ["perf", "correctness"]
    perf = doc["results"][0]
    assert perf["data"]["gate"]["speedup"] == pytest.approx(1.5)
    assert perf["data"]["timing"]["contenders"][2]["key"] == "custom"
    live = report.render_records([report.record(r) for r in results])
    rendered = jsonreport.render_file(path)
    assert rendered.splitlines()[0].startswith("cudaopt report report.json:")
    assert live in rendered
    assert rendered.endswith("cudaopt: passed: every verdict asked for ran and passed (2 passed)")
    assert "| ModelNew (custom) | 1.00 ms |" in jsonreport.render_file(path, fmt="markdown")


def test_recorded_results_from_workers_render_like_the_originals():
    original = perf_result()
    copy = results.RecordedResult(json.loads(json.dumps(report.record(original))))
    assert copy.kind == "perf" and copy.passed is True
    assert report.render_records([report.record(copy)]) == report.render_records([report.record(original)])


def test_the_report_command_prints_the_tables_and_rejects_other_files(tmp_path, capsys):
    path = write_report(tmp_path / "r.json", [perf_result()])
    assert cli_main(["report", str(path)]) == 0
    assert "ModelNew (custom)" in capsys.readouterr().out
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a cudaopt JSON report"):
        jsonreport.render_file(tmp_path / "other.json")
    assert cli_main(["report", str(tmp_path / "other.json")]) == 2
    assert "other.json: not a cudaopt JSON report" in capsys.readouterr().err


def test_machine_info_records_the_gpu_and_versions():
    info = {}
    report.machine_info(info)
    assert info["torch"] == torch.__version__
    assert info["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
    assert "cuda" in info


@dataclass
class _Untimed:
    """A result whose figures are NaN and infinite, as a median of no samples is."""

    kind = "perf"
    passed = False

    def row(self):
        return {"workdir": "/w/untimed"}

    def to_json(self):
        return {"median_s": float("nan"), "ratios": [float("inf"), 1.5], "gate": {"speedup": float("-inf")}}


def test_the_json_report_round_trips_the_gates_numbers_and_writes_null_for_nan(tmp_path):
    result = perf_result(custom=1.0 * MS, compile_=2.0 * MS, min_speedup=1.25)
    path = write_report(tmp_path / "r.json", [result, _Untimed()])
    strict = json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the JSON report"))
    perf, untimed = strict["results"]
    gate = perf["data"]["gate"]
    assert gate["passed"] is True and gate["baseline"] == "compile"
    assert (gate["custom_median_s"], gate["baseline_median_s"]) == (pytest.approx(1.0 * MS), pytest.approx(2.0 * MS))
    assert (gate["speedup"], gate["min_speedup"]) == (pytest.approx(2.0), 1.25)
    assert gate["limit_s"] == pytest.approx(2.0 * MS / 1.25)
    assert untimed["data"] == {"median_s": None, "ratios": [None, 1.5], "gate": {"speedup": None}}
    assert report.record(_Untimed())["data"]["median_s"] is None  # what crosses from pytest-xdist workers


def test_timing_summary_in_the_notes_names_the_stop_rule():
    notes = report.perf_notes(perf_result())
    assert any(n.startswith("timing: fake, ") and " interleaved rounds (2 calls of each contender a round back to "
               "back) in " in n and "relative standard error <= 0.005" in n for n in notes), notes


# -- the three figures and the kernel trace ---------------------------------------------------

def kernel(name, start_us, dur_us, stream=7, grid=(128, 1, 1)):
    return Kernel(name, stream, start_us * 1e-6, dur_us * 1e-6, grid=grid)


def traces():
    return {
        "custom": Trace([kernel("void gemm_kernel<128>(float*)", 0, 600), kernel("attention_kernel", 600, 300),
                         kernel("void gemm_kernel<128>(float*)", 900, 100, grid=(64, 1, 1))],
                        calling_stream=7, window=(0.0, 1e-3)),
        "compile": Trace([kernel("triton_poi_fused_0", 0, 500), kernel("triton_red_fused_1", 500, 400),
                          kernel("sm90_gemm", 900, 500)], calling_stream=7, window=(0.0, 2e-3)),
        "eager": Trace(error="not traced: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"),
    }


def test_the_table_shows_device_time_latency_and_kernel_sum_and_marks_the_gates_clock():
    result = perf_result(latency={"custom": 1.2 * MS, "compile": 1.6 * MS, "eager": 3.1 * MS}, traces=traces())
    rows = {r["contender"]: r for r in report.perf_rows(result)}
    custom = rows["ModelNew (custom)"]
    assert (custom["device time (gate)"], custom["latency"], custom["kernel sum"]) == ("1.00 ms", "1.20 ms", "1.00 ms")
    assert rows["torch.compile"]["kernel sum"] == "1.40 ms"
    assert rows["Model (eager)"]["kernel sum"] == "-"  # its trace failed: the notes say why
    assert custom["vs compile"] == "1.50x"  # device time gates
    text = report.perf_table(result)
    assert "clocks: the gate compares device time. device time: each contender's batch queued" in text
    assert "kernel sum: the kernels, copies and memsets of one profiled call" in text
    data = json.loads(json.dumps(report.record(result)))["data"]
    assert data["gate_clock"] == "device"
    custom_trace = data["traces"]["custom"]
    assert custom_trace["kernel_sum_s"] == pytest.approx(1.0 * MS) and custom_trace["kernels_n"] == 3
    assert custom_trace["kernels"][0] == {"name": "void gemm_kernel<128>(float*)", "kind": "kernel", "stream": 7,
                                          "start_s": 0.0, "duration_s": pytest.approx(600e-6),
                                          "grid": [128, 1, 1], "block": None}
    assert data["traces"]["eager"] == {"error": "not traced: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}
    contender = data["timing"]["contenders"][2]
    assert contender["device_median_s"] == pytest.approx(1.0 * MS)
    assert contender["latency_median_s"] == pytest.approx(1.2 * MS)
    info = report.benchmark_extra_info(result)
    assert info["custom_kernel_sum_s"] == pytest.approx(1.0 * MS) and info["gate_clock"] == "device"


def test_on_the_cpu_the_notes_say_what_the_figures_are_and_claim_no_cache_flush():
    text = report.perf_table(perf_result(clock_name="perf-counter"))
    assert "L2 flush" not in text and "no cache flush" in text
    assert ("clocks: the gate compares device time. on the CPU both figures are the host's wall time around one "
            "call (no GPU to queue behind, no cache flush), measured in separate runs") in text


def test_with_the_latency_clock_the_gate_compares_latencies():
    # Device time says 1.5x; latency says the candidate is no faster: the latency gate fails.
    result = perf_result(latency={"custom": 1.5 * MS, "compile": 1.5 * MS, "eager": 3.0 * MS},
                         gate_clock="latency")
    assert not result.passed
    assert result.gate.custom_median == pytest.approx(1.5 * MS)
    custom = report.perf_rows(result)[-1]
    assert (custom["device time"], custom["latency (gate)"]) == ("1.00 ms", "1.50 ms")
    assert "clocks: the gate compares latency." in report.perf_table(result)
    assert perf_result(latency={"custom": 1.5 * MS, "compile": 1.5 * MS, "eager": 3.0 * MS}).passed


def test_the_notes_show_the_candidates_top_kernels_and_the_others_kernel_counts():
    notes = report.perf_notes(perf_result(traces=traces()))
    (top,) = [n for n in notes if n.startswith("kernels of ModelNew")]
    assert top == ("kernels of ModelNew (custom) (one call: 3 kernels on 1 stream, 1.00 ms): "
                   "gemm_kernel x2 700 us (70%, grid 128x1x1), attention_kernel 300 us (30%, grid 128x1x1)")
    (others,) = [n for n in notes if n.startswith("kernels of the others")]
    assert others == "kernels of the others (one call): torch.compile 3 kernels (2 Triton) on 1 stream, 1.40 ms"
    assert "kernel trace of Model (eager): not traced: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED" in notes


def test_figures_that_agree_within_the_margin_give_no_warning():
    assert gate.figure_warnings(1.0 * MS, 1.1 * MS, 0.9 * MS) == []
    assert gate.figure_warnings(1.0 * MS, None, None) == []


def test_a_launch_bound_candidate_is_named_in_the_notes():
    (warning,) = gate.figure_warnings(20e-6, 80e-6, 19e-6)
    assert warning.startswith("latency 80.0 us is 4.00x the device time 20.0 us: launch-bound")
    result = perf_result(custom=20e-6, compile_=1 * MS, latency={"custom": 80e-6})
    assert "ModelNew (custom): " + warning in report.perf_notes(result)
    assert result.to_json()["figure_warnings"] == [warning]


def test_device_time_far_from_the_kernel_sum_is_named_in_the_notes():
    (gaps,) = gate.figure_warnings(1.0 * MS, 1.0 * MS, 0.5 * MS)
    assert gaps.startswith("device time 1.00 ms and kernel sum 500 us differ by 50% (more than 15%): idle gaps")
    (overlap,) = gate.figure_warnings(1.0 * MS, 1.0 * MS, 1.5 * MS)
    assert "differ by 50%" in overlap and "overlap" in overlap


def test_a_trace_escape_is_in_the_notes_even_when_another_check_failed_the_contender_first():
    escaped = Trace([kernel("scale_kernel", 0, 5, stream=13, grid=(4, 1, 1))], calling_stream=7, window=(0.0, 1e-6))
    result = perf_result(custom=0.1 * MS, escaped=1.0 * MS, traces={"custom": escaped})
    notes = report.perf_notes(result)
    assert any(n.startswith("ModelNew (custom): work escaped the measured stream") for n in notes)
    assert any(n.startswith("ModelNew (custom): work escaped the calling stream (kernel trace): kernel scale_kernel, "
                            "grid 4x1x1 on stream 13 (calling stream 7, 5.00 us) ended 4.00 us after") for n in notes)


def test_cpu_workdirs_get_no_figure_warnings_since_both_figures_are_host_time():
    result = perf_result(custom=20e-6, compile_=1 * MS, latency={"custom": 80e-6})
    assert result.to_json()["figure_warnings"]  # a device clock: warned
    result = perf_result(custom=20e-6, compile_=1 * MS, latency={"custom": 80e-6}, clock_name=clocks.PerfCounterClock.name)
    assert result.to_json()["figure_warnings"] == []
    assert not any("launch-bound" in n for n in report.perf_notes(result))


def test_the_drawn_shapes_table_stays_within_120_columns_wrapping_its_inputs():
    shapes = ("x: float32[1..32769, 1..32770], mask: bool[1..32769, 1..32770]; constants batch_size 1..32769, "
              "input_shape[0] 1..32770; drawn shapes capped at 4194304 input elements (not 2147483648): 20.00 GiB free")
    row = report.correctness_row(results.CorrectnessResult(
        workdir="/work/mywork", test="t", case="drawn shapes (31 cases)", passed=True, shapes=shapes,
        max_abs=1e-6, max_rel=2e-6))
    text = report.render_rows([row], title="cudaopt correctness: 1 of 1 passed")
    assert max(len(line) for line in text.splitlines()) <= report.TABLE_WIDTH
    words = text.split()
    assert all(word in words for word in shapes.split())   # every word still there
    assert words.count("input_shape[0]") == 1


def test_beside_pytest_benchmarks_table_a_line_says_which_figure_the_gate_read():
    lines = report.gate_figure_lines([perf_result(custom=11.8 * MS)])
    assert lines == ["cudaopt: the perf gate of /w/attn read ModelNew's median device time, 11.8 ms (the perf "
                     "table's '(gate)' column); pytest-benchmark's table times ModelNew again, alone, from the host "
                     "with a synchronise per call, for --benchmark-compare: the gate does not read it"]
