"""`cudaopt judge` on CPU workdirs: one line per workdir whatever each one does (pass, fail, segfault, hang, build failure), the table, the exit code, resume; and what a child is given."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_cudaopt.judge import copies, lines as judge_lines, stages
from pytest_cudaopt.judge.devices import DeviceSet
from pytest_cudaopt.judge.options import Options
from support import JUDGE_CACHE, JUDGE_CPU_ARGS, judge_workdirs, run_python

TIMEOUT_S = 30   # each child's limit: the hang's check ends there


def _judge_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_python(["-m", "pytest_cudaopt.cli", "judge", *args], cwd=cwd, timeout=1800)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """One `cudaopt judge` run over the five CPU cases and a folder that holds no workdir."""
    root = tmp_path_factory.mktemp("judge")
    made = judge_workdirs(root / "gallery")
    (root / "gallery" / "empty").mkdir()
    out = root / "lines.jsonl"
    args = [str(root / "gallery"), str(root / "gallery" / "empty"), "--cpu-slots", "2", "--jobs", "2",
            "--timeout", str(TIMEOUT_S), "--cache-dir", str(JUDGE_CACHE), "--out", str(out),
            "--scratch", str(root / "scratch"), "--", *JUDGE_CPU_ARGS]
    proc = _judge_cli(*args, cwd=root)
    found = {Path(line["workdir"]).name: line for line in judge_lines.read_lines(out)}
    return {"proc": proc, "lines": found, "made": made, "args": args, "out": out, "root": root,
            "raw": out.read_text().splitlines()}


def test_every_workdir_gets_exactly_one_line(judged):
    names = [Path(json.loads(raw)["workdir"]).name for raw in judged["raw"]]
    assert sorted(names) == sorted([*judged["made"], "empty"]), judged["proc"].stderr[-3000:]


def test_ray_gives_the_lines_of_the_local_pool(judged):
    """The same three workdirs through `--ray local` (one node judge running the local pool, fed
    by the driver): the verdicts of the run above, the same idempotent keys, the driver's names."""
    ray = pytest.importorskip("ray", reason="the Ray backend needs the ray extra: pip install -e '.[ray]'")
    from pytest_cudaopt.judge import Judge

    cases = {name: judged["made"][name] for name in ("honest", "wrong", "segfault")}
    options = Options(cpu_slots=2, jobs=2, timeout=TIMEOUT_S, cache_dir=JUDGE_CACHE, pytest_args=list(JUDGE_CPU_ARGS))
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        by_ray = {Path(line["workdir"]).name: line for line in Judge(list(cases.values()), options, ray="local")}
    finally:
        ray.shutdown()
    local = judged["lines"]
    assert sorted(by_ray) == sorted(cases)
    for name in cases:
        fields = ("status", "passed", "verdicts")
        assert {f: by_ray[name][f] for f in fields} == {f: local[name][f] for f in fields}, name
        assert by_ray[name]["key"] == local[name]["key"]   # the same idempotent key: same path, content, options
        assert by_ray[name]["workdir"] == str(cases[name])  # as the driver named it, not the node's copy
    assert by_ray["honest"]["passed"]
    assert (by_ray["segfault"]["status"], by_ray["segfault"]["passed"]) == ("judged", False)


def test_no_child_outlives_the_judge(judged):
    """No stage child, and no worker of one, is left running once the judge has ended."""
    scratch = str(judged["root"] / "scratch")
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(scratch.encode() in a for a in args):
            left.append(b" ".join(args).decode(errors="replace"))
    assert not left


def test_an_honest_workdir_passes_every_stage(judged):
    line = judged["lines"]["honest"]
    assert (line["status"], line["passed"]) == ("judged", True), line["reason"]
    assert line["verdicts"] == {"build": "pass", "policy": "pass", "correctness": "pass", "perf": "pass",
                                "memsafety": "skipped"}  # a CPU workdir: no CUDA kernel to sanitize
    assert line["report"]["passed"] is True and line["report"]["results"]
    assert line["key"] and line["gpu"] in ("cpu0", "cpu1")
    assert set(line["seconds"]) >= {"build", "policy", "check", "perf", "total"}
    assert line["stages"]["build"]["need_bytes"] >= 2 << 30   # the estimate: the case budget's 2 GiB at least


def test_a_wrong_workdir_fails_correctness_and_is_never_timed(judged):
    line = judged["lines"]["wrong"]
    assert (line["status"], line["passed"]) == ("judged", False)
    assert line["verdicts"]["correctness"] == "FAIL" and line["verdicts"]["perf"] == "not run"
    assert line["stages"]["perf"]["status"] == "not-run"


def test_a_segfault_ends_its_own_worker_and_says_so(judged):
    """The candidate's crash ends its worker, not the judging process: its items say so."""
    line = judged["lines"]["segfault"]
    assert (line["status"], line["passed"]) == ("judged", False)
    assert line["verdicts"]["correctness"] == "FAIL"
    assert "SIGSEGV" in line["reason"]


def test_a_hang_is_ended_at_the_time_limit(judged):
    line = judged["lines"]["hang"]
    assert (line["status"], line["passed"]) == ("timeout", False)
    assert line["stages"]["check"]["seconds"] >= TIMEOUT_S


def test_a_build_failure_carries_the_compilers_words(judged):
    line = judged["lines"]["build_error"]
    assert (line["status"], line["passed"]) == ("build-failed", False)
    assert "undeclared_offset" in line["reason"] and "kernels/scale.cpp" in line["reason"]
    assert "::" not in line["reason"] and "cudaopt build: [" not in line["reason"]  # the report, no collection or progress
    assert line["stages"]["policy"]["status"] == "not-run"


def test_a_path_that_holds_no_workdir_gets_a_line_saying_why(judged):
    line = judged["lines"]["empty"]
    assert (line["status"], line["passed"]) == ("error", False)
    assert "holds none" in line["reason"]


def test_the_run_ends_with_a_table_and_exit_3_when_something_could_not_be_judged(judged):
    proc = judged["proc"]
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cudaopt judge" in proc.stdout and "workdirs per hour" in proc.stdout
    assert "busy: cpu0" in proc.stdout


def test_the_fixed_binding_compiles_once_and_later_workdirs_take_it_from_the_cache(judged):
    objects = [judged["lines"][n]["objects"] for n in ("honest", "wrong", "segfault", "hang")]
    assert sum(o.get("cached", 0) for o in objects) >= 3 * 2   # binding.cpp and scale_binding.cpp at least


def test_a_line_judged_by_another_cudaopt_or_torch_has_another_key_and_resume_keeps_none(tmp_path, monkeypatch):
    """`--resume` keeps a line only if this judge would give it: a cudaopt changed since (a verdict's hole fixed) or
    another torch judges again."""
    from pytest_cudaopt.judge import options as options_module

    package = tmp_path / "pytest_cudaopt"
    shutil.copytree(Path(options_module.__file__).resolve().parents[1], package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    first = options_module.code_digest(package, "2.11.0")
    assert options_module.code_digest(package, "2.11.0") == first
    assert options_module.code_digest(package, "2.12.0") != first
    with open(package / "perf" / "decision.py", "a") as changed:
        changed.write("# fixed\n")
    assert options_module.code_digest(package, "2.11.0") != first
    before = options_module.result_key("w", "c", Options())
    monkeypatch.setattr(options_module, "judge_digest", lambda: "another judge")
    assert options_module.result_key("w", "c", Options()) != before


def test_resume_keeps_no_line_this_run_would_key_otherwise_and_no_superseded_line(tmp_path):
    """A named workdir whose line has another key (its files changed, or another judge wrote it) is judged again, and
    its old line is not carried into the new file beside the new one; a line of a workdir not named is kept."""
    from pytest_cudaopt.judge.engine import Judge, _kept, _key

    made = judge_workdirs(tmp_path / "gallery", names=("honest", "wrong"))
    job = Judge(list(made.values()), Options())
    honest, wrong = (_key(made[n], job.options) for n in ("honest", "wrong"))
    found = [{"workdir": str(made["honest"]), "key": honest, "status": "judged"},
             {"workdir": str(made["wrong"]), "key": "judged-before-it-changed", "status": "judged"},
             {"workdir": str(tmp_path / "elsewhere"), "key": "k", "status": "judged"},
             {"workdir": str(made["wrong"]), "key": wrong, "status": "cancelled"}]
    assert [line["key"] for line in _kept(found, job)] == [honest, "k"]


def test_resume_keeps_the_judged_lines_and_judges_only_the_rest(judged):
    args = judged["args"]
    proc = _judge_cli(*args[:args.index("--")], "--resume", *args[args.index("--"):], cwd=judged["root"])
    assert "5 kept from the earlier run" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    again = judge_lines.read_lines(judged["out"])
    assert len(again) == 6 and sum(line["status"] == "error" for line in again) == 1


# ------------------------------------------------------------------ what a child is given

def test_sigterm_ends_the_children_and_writes_a_cancelled_line_for_each_unfinished_workdir(tmp_path):
    """A CI job's time limit or a scheduler stops a judge with SIGTERM: as with Ctrl-C, every workdir named gets its
    line, the unfinished ones `cancelled`, exit 143, and no child outlives the judge."""
    import signal
    import sys
    import time

    from support import subprocess_env

    made = judge_workdirs(tmp_path / "gallery", names=("honest", "hang"))
    out, scratch = tmp_path / "lines.jsonl", tmp_path / "scratch"
    proc = subprocess.Popen([sys.executable, "-m", "pytest_cudaopt.cli", "judge", *map(str, made.values()),
                             "--cpu-slots", "2", "--jobs", "2", "--timeout", "600", "--cache-dir", str(JUDGE_CACHE),
                             "--out", str(out), "--scratch", str(scratch), "--", *JUDGE_CPU_ARGS],
                            cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and not (out.exists() and out.read_text()):
        time.sleep(0.2)   # the honest workdir's line: the hang's check runs meanwhile, to its 600 s limit
    proc.send_signal(signal.SIGTERM)
    said, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, said[-3000:]
    found = {Path(line["workdir"]).name: line for line in judge_lines.read_lines(out)}
    assert (found["honest"]["status"], found["hang"]["status"]) == ("judged", "cancelled"), said[-3000:]
    assert found["hang"]["reason"] == "the judge was interrupted while this workdir was judged"
    left = [c for c in Path("/proc").glob("[0-9]*/cmdline") if _reads(c, str(scratch).encode())]
    assert not left


INTERRUPTED_WHILE_WRITING = """
import sys
from pytest_cudaopt import cli
from pytest_cudaopt.judge import display

shown = display.Progress.line

def line(self, line):   # Ctrl-C while the judge writes a finished workdir's line, outside its pool
    shown(self, line)
    raise KeyboardInterrupt

display.Progress.line = line
sys.exit(cli.main(sys.argv[1:]))
"""


def test_an_interrupt_while_a_line_is_written_still_gives_every_unfinished_workdir_its_cancelled_line(tmp_path):
    """Ctrl-C (or SIGTERM) lands where it lands: here in the writing of the first finished workdir's line, not in
    the pool, whose own handler ends the children and gives each workdir left its `cancelled` line. Nothing is lost."""
    made = judge_workdirs(tmp_path / "gallery", names=("honest", "hang"))
    out, scratch = tmp_path / "lines.jsonl", tmp_path / "scratch"
    (tmp_path / "interrupted.py").write_text(INTERRUPTED_WHILE_WRITING)
    done = run_python(["interrupted.py", "judge", *map(str, made.values()), "--cpu-slots", "2", "--jobs", "2",
                       "--timeout", "600", "--cache-dir", str(JUDGE_CACHE), "--out", str(out), "--scratch",
                       str(scratch), "--", *JUDGE_CPU_ARGS], cwd=tmp_path, timeout=600)
    assert done.returncode == 130, done.stdout[-2000:] + done.stderr[-3000:]
    found = {Path(line["workdir"]).name: line for line in judge_lines.read_lines(out)}
    assert sorted(found) == ["hang", "honest"], done.stderr[-3000:]
    assert (found["honest"]["status"], found["hang"]["status"]) == ("judged", "cancelled")
    assert found["hang"]["reason"] == "the judge was interrupted while this workdir was judged"
    assert len(out.read_text().splitlines()) == 2
    left = [c for c in Path("/proc").glob("[0-9]*/cmdline") if _reads(c, str(scratch).encode())]
    assert not left


def _reads(cmdline: Path, part: bytes) -> bool:
    try:
        return any(part in arg for arg in cmdline.read_bytes().split(b"\0"))
    except OSError:
        return False


def test_a_childs_environment_is_scrubbed_of_the_judges_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDAOPT_SEED", "1234")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("PATH", os.environ.get("PATH", "/usr/bin"))
    options = Options(cache_dir=tmp_path / "cache")
    env = stages.environment("check", DeviceSet(["3"]), "3", options)
    assert "CUDAOPT_SEED" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"]
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "cache" / "inductor").resolve())
    assert stages.environment("build", DeviceSet(["3"]), None, options)["CUDA_VISIBLE_DEVICES"] == ""


def test_no_seed_reaches_a_childs_command_line_unless_replaying(tmp_path):
    command = stages.command("check", tmp_path / "w", tmp_path / "out", Options())
    assert not any(arg.startswith("--cudaopt-seed") for arg in command)
    replay = stages.command("check", tmp_path / "w", tmp_path / "out", Options(seed=5))
    assert "--cudaopt-seed=5" in replay


def test_a_perf_child_is_given_its_check_stages_report_when_there_is_one(tmp_path):
    """So that its workdir tier counts the correctness results as a whole pytest session's perf item does."""
    out = tmp_path / "out"
    out.mkdir()
    assert not any(a.startswith("--cudaopt-correctness-report") for a in stages.command("perf", tmp_path, out, Options()))
    (out / "check.json").write_text("{}")
    assert f"--cudaopt-correctness-report={out / 'check.json'}" in stages.command("perf", tmp_path, out, Options())
    assert not any(a.startswith("--cudaopt-correctness-report") for a in stages.command("check", tmp_path, out, Options()))


def test_a_private_copy_has_no_earlier_build_and_no_link_out(tmp_path):
    src = tmp_path / "src"
    (src / "build" / "cudaopt").mkdir(parents=True)
    (src / "build" / "cudaopt" / "cuda_extension.so").write_bytes(b"planted")
    (src / "model.py").write_text("x = 1\n")
    shared = tmp_path / "problem" / "peers.py"  # an owner's file shared by a problem's candidates
    shared.parent.mkdir()
    shared.write_text("PEERS = {}\n")
    (src / "peers.py").symlink_to(shared)
    secret = tmp_path / "other" / "kernels" / "scale.cu"  # another candidate's kernel
    secret.parent.mkdir(parents=True)
    secret.write_text("theirs\n")
    (src / "kernels").mkdir()
    (src / "kernels" / "scale.cu").symlink_to(secret)
    (src / "model_new.py").symlink_to(secret)
    digest = copies.private_copy(src, tmp_path / "copy")
    copied = tmp_path / "copy"
    assert not (copied / "build").exists()
    assert (copied / "peers.py").is_file() and not (copied / "peers.py").is_symlink()
    assert (copied / "peers.py").read_text() == "PEERS = {}\n"
    assert not (copied / "kernels" / "scale.cu").exists() and not (copied / "model_new.py").exists()
    packed, same = copies.pack(src)
    copies.unpack(packed, tmp_path / "unpacked")
    assert same == digest and (tmp_path / "unpacked" / "model.py").read_text() == "x = 1\n"


def test_passed_needs_a_child_that_ended_normally_with_a_report_that_says_passed():
    report = {"schema": "cudaopt-report/1", "passed": True, "results": []}
    cases = [{"kind": k, "name": "t", "outcome": "passed", "seconds": 0.1} for k in ("policy", "correctness", "perf")]
    ok = [stages.StageResult(s, "ok", 1.0, report=report if s != "build" else None,
                             cases=[c for c in cases if stages.EXPECTED.get(s, ("",))[0] == c["kind"]])
          for s in ("build", "policy", "check", "perf")]
    assert judge_lines.assemble(workdir="w", key="k", content="", results=ok, seconds={})["passed"] is True
    crashed = [*ok[:3], stages.StageResult("perf", "crashed", 1.0, report=report, reason="killed by SIGSEGV")]
    line = judge_lines.assemble(workdir="w", key="k", content="", results=crashed, seconds={})
    assert (line["status"], line["passed"]) == ("crashed", False)
    outcome = type("Outcome", (), {"timed_out": False, "signal": None, "returncode": 0, "seconds": 1.0, "tail": ""})()
    read = stages.read_pytest("perf", outcome, Path("/nonexistent.json"), Path("/nonexistent.xml"))
    assert read.status == "crashed" and "without writing its JSON report" in read.reason


def test_the_merged_report_keeps_every_stages_items_and_the_first_unfinished_stages_cause():
    def doc(test, status, complete=True, cause=None):
        return {"schema": "cudaopt-report/2", "passed": status == "passed", "complete": complete, "cause": cause,
                "reason": cause and f"{test} {cause}", "running": test if cause else None, "results": [],
                "items": [{"test": test, "status": status}], "not_passed": [] if status == "passed" else [test]}
    results = [stages.StageResult("policy", "ok", 1.0, report=doc("p", "passed")),
               stages.StageResult("check", "ok", 1.0, report=doc("c", "failed", False, "timeout")),
               stages.StageResult("perf", "ok", 1.0, report=doc("t", "passed", False, "crash"))]
    merged = judge_lines.merge_reports(results)
    assert [i["test"] for i in merged["items"]] == ["p", "c", "t"] and merged["not_passed"] == ["c"]
    assert (merged["passed"], merged["complete"], merged["cause"], merged["running"]) == (False, False, "timeout", "c")
    finished = judge_lines.merge_reports(results[:1])
    assert (finished["passed"], finished["complete"]) == (True, True) and "cause" not in finished


def test_a_judge_lines_report_renders_with_its_counts_and_each_stages_seed(tmp_path):
    from pytest_cudaopt.results import jsonreport

    def doc(test, seed):
        return {"schema": jsonreport.SCHEMA, "passed": True, "complete": True, "seed": seed, "results": [],
                "items": [{"test": test, "status": "passed"}], "not_passed": [], "counts": {"passed": 2}}
    merged = judge_lines.merge_reports([stages.StageResult("policy", "ok", 1.0, report=doc("p", 11)),
                                        stages.StageResult("check", "ok", 1.0, report=doc("c", 22))])
    assert merged["counts"] == {"passed": 4}
    (tmp_path / "line.json").write_text(json.dumps(merged))
    text = jsonreport.render_file(tmp_path / "line.json")
    assert "seeds policy 11, check 22" in text and "seed None" not in text
    assert "cudaopt: passed: every verdict asked for ran and passed (4 passed)" in text
    assert "no verdict items" not in text


def test_judge_takes_any_number_of_paths_then_pytest_arguments_after_a_double_dash(monkeypatch):
    from pytest_cudaopt import cli

    seen = {}
    monkeypatch.setattr(cli, "cmd_judge", lambda args: seen.update(
        paths=args.paths, extra=args.pytest_args, gpus=args.gpus) or 0)
    assert cli.main(["judge", "a", "b", "--gpus", "0,3", "--", "--cudaopt-device=cpu", "-x"]) == 0
    assert seen == {"paths": ["a", "b"], "extra": ["--cudaopt-device=cpu", "-x"], "gpus": "0,3"}


def test_an_out_that_is_a_folder_another_file_or_unwritable_is_refused_before_any_workdir_is_judged(
        tmp_path, capsys):
    """Exit 2 with the reason, nothing judged and nothing overwritten: a typo such as `--out model.py` must not
    empty the user's file hours into a run, nor end it with a traceback."""
    from pytest_cudaopt import cli

    model = tmp_path / "model.py"
    model.write_text("import torch\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out, why in ((tmp_path, "is a folder"), (model, "exists and does not hold `cudaopt judge` lines; it is "
                                                        "left alone"), (blocker / "lines.jsonl", "cannot be written")):
        assert cli.main(["judge", str(tmp_path / "missing"), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"cudaopt judge: --out {out}: ") and why in err, err
    assert model.read_text() == "import torch\n"
    lines = tmp_path / "lines.jsonl"   # an earlier run's lines (the workdir named is none: its line says so)
    lines.write_text(json.dumps({"schema": "cudaopt-judge/1", "workdir": "old"}) + "\n")
    assert cli.main(["judge", str(tmp_path / "missing"), "--out", str(lines)]) == 3
    assert [json.loads(raw)["status"] for raw in lines.read_text().splitlines()] == ["error"]


def test_each_line_carries_its_id_and_its_time_queued_and_judging(judged):
    """Ids: each workdir's place among those found, then the path that named none; the time from
    the judge's start to a line is its queue time and its judging time."""
    found = [json.loads(raw) for raw in judged["raw"]]
    assert sorted(line["id"] for line in found) == list(range(len(found)))
    assert next(line["id"] for line in found if Path(line["workdir"]).name == "empty") == len(found) - 1
    for line in found:
        seconds = line["seconds"]
        assert seconds["total"] == pytest.approx(seconds["queued"] + seconds["judging"], abs=0.01)
    honest = judged["lines"]["honest"]["seconds"]
    assert honest["judging"] >= honest["build"] + honest["perf"] - 0.01


def test_with_turns_a_perf_child_times_in_its_turn_and_the_verdicts_stay_the_same(judged):
    from pytest_cudaopt.judge import Judge

    cases = {name: judged["made"][name] for name in ("honest", "wrong")}
    options = Options(cpu_slots=2, jobs=2, timeout=TIMEOUT_S, cache_dir=JUDGE_CACHE, pytest_args=list(JUDGE_CPU_ARGS),
                      turns=True, scratch=judged["root"] / "turns", keep=True)
    found = {Path(line["workdir"]).name: line for line in Judge(list(cases.values()), options)}
    for name in cases:
        assert (found[name]["passed"], found[name]["verdicts"]) == (judged["lines"][name]["passed"],
                                                                   judged["lines"][name]["verdicts"]), name
    honest = found["honest"]
    assert honest["seconds"]["perf_turn"] > 0 and honest["seconds"]["perf_wait"] >= 0   # it asked, and was granted
    # the child left its device (its turn and place) at its session's end, before its exit
    assert sorted(p.name for p in (judged["root"] / "turns").glob("*/out/turn/*")) == ["go", "left", "want"]
    seconds = honest["seconds"]
    assert seconds["perf_exit"] >= 0 and seconds["check_exit"] >= 0
    assert seconds["perf_wait"] + seconds["perf_turn"] + seconds["perf_exit"] <= seconds["perf"] + 0.01
    assert "perf_turn" not in found["wrong"]["seconds"]   # never timed
    assert found["wrong"]["seconds"]["check_exit"] >= 0
