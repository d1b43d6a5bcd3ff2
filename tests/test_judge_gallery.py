"""benchmarks/judge_gallery.py in its CPU smoke mode: both arms run the same CPU workdirs and agree on every verdict."""

from __future__ import annotations

import json

from support import JUDGE_CACHE, REPO_ROOT, run_python


def test_the_gallery_benchmark_runs_on_cpu_and_both_arms_agree(tmp_path):
    proc = run_python([str(REPO_ROOT / "benchmarks" / "judge_gallery.py"), "--smoke", "--out", str(tmp_path),
                       "--cache-dir", str(JUDGE_CACHE), "--pytest-cache"], timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verdicts: the same for every workdir" in proc.stdout
    assert "workdirs/hour" in proc.stdout and "time by stage" in proc.stdout
    found = json.loads((tmp_path / "judge_gallery.json").read_text())
    verdicts = {name: r["passed"] for name, r in found["pytest"]["results"].items()}
    assert verdicts == {"cpu_scale-honest": True, "cpu_scale-wrong": False, "cpu_scale-build_error": False}
    assert found["judge"]["results"]["cpu_scale-build_error"]["status"] == "build-failed"


def test_the_pytest_arm_split_over_calls_adds_up_to_one_arm(tmp_path):
    """--pytest-part I/N runs every N-th workdir from the I-th; --combine adds the parts' sessions up."""
    part = tmp_path / "part2"
    proc = run_python([str(REPO_ROOT / "benchmarks" / "judge_gallery.py"), "--smoke", "--arm", "pytest",
                       "--pytest-part", "2/3", "--out", str(part), "--cache-dir", str(JUDGE_CACHE), "--pytest-cache"],
                      timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    second = json.loads((part / "judge_gallery.json").read_text())
    assert list(second["pytest"]["results"]) == ["cpu_scale-wrong"]
    first = {"pytest": {"wall_s": 30.0, "results": {"cpu_scale-honest": {
        "passed": True, "exit": 0, "seconds": 30.0, "time": {"perf": 2.0}, "verdicts": {"perf": "pass"}}}},
        "judge": None}
    (tmp_path / "part1.json").write_text(json.dumps(first))
    proc = run_python([str(REPO_ROOT / "benchmarks" / "judge_gallery.py"), "--out", str(tmp_path / "combined"),
                       "--combine", str(tmp_path / "part1.json"), str(part / "judge_gallery.json")], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wall = 30.0 + second["pytest"]["wall_s"]
    assert f"pytest sessions: 2 workdirs in {wall:.1f} s" in proc.stdout
    assert "cpu_scale-honest" in proc.stdout and "cpu_scale-wrong" in proc.stdout


def test_a_judge_arm_cut_at_its_limit_is_combined_from_its_lines(tmp_path):
    """A rate step cut at its time limit leaves judge.jsonl only: --combine takes it as the judge arm, its wall
    the last line's time, its verdicts against the pytest arm's (a copy against its first copy's session)."""
    def line(name: str, passed: bool, total: float) -> dict:
        return {"workdir": f"/x/judge/{name}", "passed": passed, "status": "judged", "verdicts": {"perf": "FAIL"},
                "seconds": {"total": total}, "time": {"perf": 1.0}, "objects": {}}

    (tmp_path / "judge.jsonl").write_text("".join(json.dumps(line(*args)) + "\n" for args in (
        ("cpu_scale-honest", True, 40.0), ("cpu_scale-wrong", False, 50.0), ("cpu_scale-honest-2", False, 90.0))))
    sessions = {"pytest": {"wall_s": 60.0, "results": {
        name: {"passed": passed, "exit": 0 if passed else 1, "seconds": 30.0, "time": {}, "verdicts": {}}
        for name, passed in (("cpu_scale-honest", True), ("cpu_scale-wrong", False))}}, "judge": None}
    (tmp_path / "pytest.json").write_text(json.dumps(sessions))
    proc = run_python([str(REPO_ROOT / "benchmarks" / "judge_gallery.py"), "--out", str(tmp_path / "combined"),
                       "--combine", str(tmp_path / "pytest.json"), str(tmp_path / "judge.jsonl")], timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]   # the second copy's verdict differs
    assert "cudaopt judge: 3 workdirs in 90.0 s = 120 workdirs/hour" in proc.stdout
    assert [row.split()[0] for row in proc.stdout.splitlines() if " NO " in row] == ["cpu_scale-honest-2"]


def test_a_gallery_copy_builds_from_cold_and_is_compared_with_the_first_copys_pytest_verdict(tmp_path):
    import sys

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import judge_gallery
    finally:
        sys.path.pop(0)
    first, second = judge_gallery.gpu_gallery(tmp_path / "a"), judge_gallery.gpu_gallery(tmp_path / "b", copy=2)
    assert [w.name + "-2" for w in first] == [w.name for w in second]
    for one, two in zip(first, second):
        [cu] = (one / "kernels").glob("*.cu")
        assert (two / "kernels" / cu.name).read_text() != cu.read_text()   # no object of copy 1 serves copy 2
    line = {"passed": False, "status": "judged", "verdicts": {}, "seconds": {"total": 1.0}, "time": {}, "objects": {}}
    pytest_run = {"wall_s": 1.0, "results": {"gelu-honest": {"passed": True, "seconds": 1.0, "time": {},
                                                             "verdicts": {}}}}
    text, same = judge_gallery.table(pytest_run, {"wall_s": 1.0, "results": {"gelu-honest-2": line}}, 1)
    assert not same and "NO" in text


def test_with_no_pytest_arm_each_copy_is_compared_with_its_first_copy_item_by_item():
    """A copy whose items differ from its first copy's (an honest check that failed loading beside a memory hog)
    is marked, where a judge-only run once said every verdict was the same."""
    import sys

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import judge_gallery
    finally:
        sys.path.pop(0)

    def line(correctness: str) -> dict:
        return {"passed": False, "status": "judged", "verdicts": {"correctness": correctness, "perf": "FAIL"},
                "seconds": {"total": 1.0}, "time": {}, "objects": {}}

    judge_run = {"wall_s": 10.0, "busy": {"0": 0.9},
                 "results": {"a": line("pass"), "a-2": line("pass"), "a-3": line("FAIL")}}
    text, same = judge_gallery.table(None, judge_run, 1)
    assert not same and "DIFFERENT" in text
    assert [row.split()[0] for row in text.splitlines() if " NO " in row] == ["a-3"]
    judge_run["results"]["a-3"] = line("pass")
    text, same = judge_gallery.table(None, judge_run, 1)
    assert same and "verdicts: each copy's items as its first copy's" in text


def test_the_summary_counts_the_attempts_judged_again_by_their_cause():
    import sys

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        import judge_gallery
    finally:
        sys.path.pop(0)
    short = {"status": "error", "blame": "environment",
             "reason": "not the candidate's fault but the environment's: test_canonical[seed0] ran short"}
    lines = {name: {"passed": False, "status": "judged", "verdicts": {"correctness": "pass"}, "seconds": {"total": 1.0},
                    "time": {}, "objects": {}, **({"earlier": earlier} if earlier else {})}
             for name, earlier in (("a", [short, short]), ("b", [short]), ("c", []))}
    text, _ = judge_gallery.table(None, {"wall_s": 10.0, "busy": {"0": 0.9}, "results": lines}, 1)
    assert "judged again: 3 attempts; 3 x error: not the candidate's fault but the environment's:" in text, text
