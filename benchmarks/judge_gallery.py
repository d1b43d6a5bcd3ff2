"""A gallery of workdirs judged two ways, one `pytest` session after another and `cudaopt judge`: verdicts side by side, wall time, workdirs per hour, time by stage.

    python3 benchmarks/judge_gallery.py [--out DIR] [--arm both|pytest|judge] [--gpus 0,1]   # GPU
    python3 benchmarks/judge_gallery.py --smoke --out DIR                                   # CPU

GPU (default): 13 workdirs built from benchmarks/gallery/gpu/<problem>/ (model.py, model_new.py,
one binding, and one workdir per `<op>.<variant>.cu`: honest, wrong, slow, a CUDA fault, a memory hog, a build
error), each with the fixed binding files and a lock. --smoke: 3 CPU workdirs from the repo's
tests/workdirs (cpu_scale honest, wrong, failing to build) with --cudaopt-device=cpu. Both arms
get the same short timing settings, cold caches of their own (a fresh torch.compile cache each;
the judge's object cache starts empty unless --cache-dir names one) and the same copies of the
gallery. Results: OUT/judge_gallery.json, OUT/judge_gallery.txt (the table), OUT/pytest/*.log.
Exit 0 when both arms give every workdir the same verdict, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pytest_cudaopt runs from the checkout, uninstalled
    sys.path.insert(0, str(ROOT))

GALLERY = ROOT / "benchmarks" / "gallery"
TESTS = ROOT / "tests" / "workdirs"
TEMPLATES = ROOT / "pytest_cudaopt" / "templates"
GPU_ARGS = ["--cudaopt-max-time=1", "--cudaopt-warmup=0.2", "--cudaopt-min-runs=20", "--cudaopt-max-examples=10"]
CPU_ARGS = ["--cudaopt-device=cpu", "--cudaopt-compile-backend=eager", "--cudaopt-max-time=1", "--cudaopt-warmup=0.1",
            "--cudaopt-min-runs=5", "--cudaopt-max-examples=5"]


def _finish(workdir: Path) -> Path:
    from pytest_cudaopt.commands import scaffold

    for name in ("binding.cpp", "binding_registry.h"):
        if not (workdir / name).is_file():
            shutil.copyfile(TEMPLATES / name, workdir / name)
    scaffold.lock_workdir(workdir)
    return workdir


def gpu_gallery(dest: Path, copy: int = 1) -> list[Path]:
    """One workdir per `<op>.<variant>.cu` of each problem in benchmarks/gallery/gpu; a `copy` past the first
    gets a comment of its own in each kernel, so its build compiles from cold like the first's."""
    made = []
    for problem in sorted(p for p in (GALLERY / "gpu").iterdir() if p.is_dir()):
        for kernel in sorted(problem.glob("*.*.cu")):
            op, variant = kernel.name.split(".")[:2]
            workdir = dest / f"{problem.name}-{variant}" if copy == 1 else dest / f"{problem.name}-{variant}-{copy}"
            (workdir / "kernels").mkdir(parents=True)
            shutil.copyfile(problem / "model.py", workdir / "model.py")
            override = problem / f"model_new.{variant}.py"
            shutil.copyfile(override if override.is_file() else problem / "model_new.py", workdir / "model_new.py")
            shutil.copyfile(kernel, workdir / "kernels" / f"{op}.cu")
            if copy > 1:
                with open(workdir / "kernels" / f"{op}.cu", "a") as cu:
                    cu.write(f"// gallery copy {copy}\n")
            shutil.copyfile(problem / f"{op}_binding.cpp", workdir / "kernels" / f"{op}_binding.cpp")
            made.append(_finish(workdir))
    return made


def cpu_gallery(dest: Path) -> list[Path]:
    """The smoke gallery: the repo's CPU example workdir, honest, wrong and failing to build."""
    made = []
    for variant in ("honest", "wrong", "build_error"):
        workdir = dest / f"cpu_scale-{variant}"
        (workdir / "kernels").mkdir(parents=True)
        shutil.copyfile(TESTS / "_shared" / "model.py", workdir / "model.py")
        shutil.copyfile(TESTS / "cpu_scale" / "model_new.py", workdir / "model_new.py")
        for name in ("scale.cpp", "scale_binding.cpp"):
            shutil.copyfile(TESTS / "_shared" / "kernels" / name, workdir / "kernels" / name)
        overlay = TESTS / "judge_variants" / variant
        for path in overlay.rglob("*") if overlay.is_dir() else ():
            if path.is_file():
                shutil.copyfile(path, workdir / path.relative_to(overlay))
        made.append(_finish(workdir))
    return made


def pytest_arm(workdirs: list[Path], args: list[str], out: Path, env: dict, progress: Path | None = None) -> dict:
    """One plain pytest session per workdir, one after another (build included); with
    `progress`, the arm so far is written there after each session (a device call cut short
    keeps the sessions it finished)."""
    from pytest_cudaopt.judge.stages import read_junit
    from pytest_cudaopt.launch import pytest_command

    results, start = {}, time.monotonic()
    for workdir in workdirs:
        report, junit = out / f"{workdir.name}.json", out / f"{workdir.name}.xml"
        command = pytest_command([str(workdir / "model_new.py"), "--rootdir", str(workdir), "-p", "no:cacheprovider",
                                  "-p", "no:benchmark", "-q", f"--cudaopt-report={report}", f"--junitxml={junit}",
                                  *args])
        t = time.monotonic()
        with open(out / f"{workdir.name}.log", "w") as log:
            code = subprocess.call(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        seconds = time.monotonic() - t
        try:
            doc = json.loads(report.read_text())
        except (OSError, ValueError):
            doc = None
        cases = read_junit(junit)
        kinds: dict[str, float] = {}
        for case in cases:
            kinds[case["kind"]] = kinds.get(case["kind"], 0.0) + case["seconds"]
        results[workdir.name] = {"passed": code == 0 and bool(doc and doc.get("passed")), "exit": code,
                                 "seconds": seconds, "time": kinds, "verdicts": _verdicts(cases)}
        print(f"pytest arm: {workdir.name}: exit {code}, {seconds:.1f} s", flush=True)
        if progress is not None:
            progress.write_text(json.dumps({"pytest": {"wall_s": time.monotonic() - start, "results": results},
                                            "judge": None}))
    return {"wall_s": time.monotonic() - start, "results": results}


def _verdicts(cases: list[dict]) -> dict[str, str]:
    from pytest_cudaopt.judge.lines import verdicts
    from pytest_cudaopt.judge.stages import StageResult

    return verdicts([StageResult("all", "ok", cases=cases)])


def judge_arm(workdirs: list[Path], args: list[str], cache: Path, gpus: list[str] | None, out: Path,
              fork: bool = True, share: int | None = None, turns: bool = True, ahead: int | None = None) -> dict:
    from pytest_cudaopt import judge

    options = judge.Options(gpus=gpus, pytest_args=list(args), cache_dir=cache, timeout=300, cpu_slots=2,
                            fork=fork, turns=turns, ahead=ahead, scratch=out / "scratch", keep=True,
                            **({"share": share} if share else {}))
    job = judge.Judge(workdirs, options)
    lines = []
    with open(out / "judge.jsonl", "w") as handle:
        for line in job:
            handle.write(json.dumps(line) + "\n")
            lines.append(line)
            print(f"judge arm: {Path(line['workdir']).name}: {line['status']} {line['seconds'].get('total', 0):.1f} s",
                  flush=True)
    # what each device stage had touched when it asked for its place (run/turn.py): CUDA never, on a GPU too
    asks = [json.loads(p.read_text() or "{}") for p in (out / "scratch").glob("*/out/*-place/want")]
    shutil.rmtree(out / "scratch", ignore_errors=True)
    return {"wall_s": job.wall_s, "busy": job.busy, "place_asks": len(asks),
            "cuda_before_place": sum(bool(a.get("cuda_initialized")) for a in asks),
            "context_before_place": sum(bool(a.get("cuda_context")) for a in asks),
            "results": {Path(line["workdir"]).name: line for line in lines}}


def table(pytest_run: dict | None, judge_run: dict | None, devices: int) -> tuple[str, bool]:
    """Verdicts side by side, then throughput and time by stage for each arm."""
    from pytest_cudaopt.results.report import render_rows

    names = sorted({*((pytest_run or {}).get("results", {})), *((judge_run or {}).get("results", {}))})
    rows, same = [], True
    for name in names:
        base = re.sub(r"-\d+$", "", name)   # a copy is compared with the first copy's pytest session
        p = (pytest_run or {}).get("results", {}).get(name) or (pytest_run or {}).get("results", {}).get(base)
        j = (judge_run or {}).get("results", {}).get(name)
        first = (judge_run or {}).get("results", {}).get(base) if pytest_run is None else None
        # with no pytest arm, a copy's item verdicts against its first copy's (a verdict that depends on its neighbours)
        agree = (p is None or j is None or p["passed"] == j["passed"]) and (
            first is None or j is None or first["verdicts"] == j["verdicts"])
        same &= agree
        rows.append({"workdir": name, "pytest": "-" if p is None else "PASS" if p["passed"] else "FAIL",
                     "judge": "-" if j is None else "PASS" if j["passed"] else "FAIL",
                     "judge status": j["status"] if j else "-", "same": "yes" if agree else "NO",
                     "pytest verdicts": " ".join(f"{k}:{v}" for k, v in p["verdicts"].items()) if p else "-",
                     "judge verdicts": " ".join(f"{k}:{v}" for k, v in j["verdicts"].items()) if j else "-",
                     "pytest s": f"{p['seconds']:.1f}" if p else "-",
                     "judge s": f"{j['seconds']['total']:.1f}" if j else "-",
                     "baseline compile s": f"{j['time'].get('baseline_compile', 0):.1f}" if j else "-"})
    notes = []
    errors = [line for line in (judge_run or {}).get("results", {}).values() if line["status"] == "error"]
    for label, run in (("pytest sessions", pytest_run), ("cudaopt judge", judge_run)):
        if not run:
            continue
        n, wall = len(run["results"]), max(run["wall_s"], 1e-3)   # a judge that refused at once took ~0 s
        notes.append(f"{label}: {n} workdirs in {wall:.1f} s = {n * 3600 / wall:.0f} workdirs/hour, "
                     f"{n * 3600 / (wall * devices):.0f} per device-hour"
                     + (f" (its lines in {run['from_lines']}: by its last line)" if run.get("from_lines") else ""))
    if pytest_run and judge_run:
        rate = {k: len(r["results"]) / r["wall_s"] for k, r in (("pytest", pytest_run), ("judge", judge_run))}
        notes.append(f"cudaopt judge / pytest sessions: {rate['judge'] / rate['pytest']:.2f}x the workdirs per hour")
        spent: dict[str, float] = {}
        for r in pytest_run["results"].values():
            for k, v in r["time"].items():
                spent[k] = spent.get(k, 0.0) + v
        notes.append("pytest sessions, item time by kind (the build is inside the first item): "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in spent.items()))
    if judge_run:
        spent = {}
        for line in judge_run["results"].values():
            for k, v in line["time"].items():
                spent[k] = spent.get(k, 0.0) + v
        notes.append("cudaopt judge, time by stage (summed): " + ", ".join(f"{k} {v:.1f} s" for k, v in spent.items()))
        turns = [(line["seconds"].get("perf_wait", 0.0), line["seconds"].get("perf_turn", 0.0))
                 for line in judge_run["results"].values() if line["seconds"].get("perf_turn")]
        if turns:
            held = sorted(h for _, h in turns)
            notes.append(f"perf turns: {len(turns)}, waited {sum(w for w, _ in turns):.1f} s, held the device alone "
                         f"{sum(held):.1f} s (median {held[len(held) // 2]:.2f} s)")
        for stage in ("check", "perf"):
            paused = [line["seconds"][f"{stage}_paused"] for line in judge_run["results"].values()
                      if line["seconds"].get(f"{stage}_paused")]
            if paused:
                notes.append(f"{stage} stages paused for a turn: {len(paused)}, {sum(paused):.1f} s in all")
        in_place = sorted(line["seconds"]["check"] - line["seconds"].get("check_before_place", 0.0)
                          - line["seconds"].get("check_place_wait", 0.0) - line["seconds"].get("check_paused", 0.0)
                          for line in judge_run["results"].values() if "check_place_wait" in line["seconds"])
        if in_place:
            notes.append(f"a check in its place, not paused: median {in_place[len(in_place) // 2]:.2f} s")
        again = [e for line in judge_run["results"].values() for e in line.get("earlier", [])]
        if again:   # each attempt judged again, by its status and its reason's first words
            causes: dict[str, int] = {}
            for e in again:
                cause = f"{e.get('status')}: {' '.join(str(e.get('reason') or '').split()[:12])}"
                causes[cause] = causes.get(cause, 0) + 1
            notes.append(f"judged again: {len(again)} attempts; " + "; ".join(f"{n} x {c}" for c, n in causes.items()))
        before = [line["seconds"].get(f"{s}_before_place", 0.0) for line in judge_run["results"].values()
                  for s in ("check", "perf") if f"{s}_place_wait" in line["seconds"]]
        waits = [line["seconds"].get(f"{s}_place_wait", 0.0) for line in judge_run["results"].values()
                 for s in ("check", "perf")]
        if before:
            notes.append(f"places: {len(before)} asked, after {sum(before):.1f} s of start-up without one (summed), "
                         f"waited {sum(waits):.1f} s; CUDA initialised before the place by "
                         f"{judge_run.get('cuda_before_place', '?')} of {judge_run.get('place_asks', '?')}, "
                         f"a CUDA context made by {judge_run.get('context_before_place', '?')}")
        notes.append("busy: " + ", ".join(f"{d} {f:.0%}" for d, f in judge_run.get("busy", {}).items()))
        cached = sum(line["objects"].get("cached", 0) for line in judge_run["results"].values())
        compiled = sum(line["objects"].get("compiled", 0) for line in judge_run["results"].values())
        notes.append(f"objects: {cached} from the cache, {compiled} compiled")
        if errors:   # the judge could not judge them: no verdict, and the run is no measurement
            notes.append(f"judge errors: {len(errors)} workdirs, the first: {errors[0]['reason'][:200]}")
    against = "each copy's items as its first copy's" if pytest_run is None else "the same for every workdir"
    notes.append("verdicts: " + (against if same else "DIFFERENT (see the rows marked NO)"))
    title = "judge gallery: one pytest session after another vs cudaopt judge"
    return render_rows(rows, title=title, notes=notes), same and not errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or "judge-gallery-out")
    parser.add_argument("--smoke", action="store_true", help="CPU workdirs (what CI runs)")
    parser.add_argument("--arm", choices=("both", "pytest", "judge"), default="both")
    parser.add_argument("--gpus", default=None, help="GPU indices for the judge arm (default: all visible)")
    parser.add_argument("--cache-dir", default=None, help="the judge arm's caches (default: a fresh folder)")
    parser.add_argument("--pytest-sample", type=int, default=1, metavar="K",
                        help="the pytest arm judges every K-th workdir only (its rate is per workdir; verdicts are "
                             "compared on those), for a device call too short for both arms in full")
    parser.add_argument("--pytest-part", default=None, metavar="I/N",
                        help="the pytest arm judges the I-th of N interleaved parts of the gallery only (one device "
                             "call per part; --combine puts the parts together)")
    parser.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                        help="no run: the table of earlier runs' judge_gallery.json files, their pytest arms "
                             "added up (sessions one after another in every part) and the last judge arm; a "
                             "judge.jsonl is a judge arm from its lines (a run cut at its time limit writes no "
                             "judge_gallery.json): its wall is its last line's time")
    parser.add_argument("--no-fork", action="store_true",
                        help="the judge arm executes each stage's child instead of forking it from its zygote")
    parser.add_argument("--sandbox", choices=("require", "auto", "off"), default=None,
                        help="cudaopt_sandbox of both arms (default: the judge's own, require on GPUs)")
    parser.add_argument("--judge-first", action="store_true", help="run the judge arm before the pytest arm")
    parser.add_argument("--skip-memsafety", action="store_true",
                        help="leave the memory-safety item out of both arms (-k 'not test_memory_safety')")
    parser.add_argument("--extra", nargs="+", default=[], metavar="WORKDIR",
                        help="more workdirs judged in both arms beside the gallery (copied, given the fixed binding "
                             "files and a lock), e.g. benchmarks/workdirs/kb_softmax at its published size")
    parser.add_argument("--copies", type=int, default=1, metavar="N",
                        help="the judge arm judges the GPU gallery N times over, each copy built from cold (a "
                             "steadier rate than one pass; the pytest arm judges the first copy)")
    parser.add_argument("--share", type=int, default=None, metavar="N", help="the judge arm's --share")
    parser.add_argument("--ahead", type=int, default=None, metavar="N", help="the judge arm's --ahead")
    parser.add_argument("--no-turns", action="store_true",
                        help="the judge arm's perf stages hold their GPU alone from their start (Options(turns=False))")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="one more pytest argument for both arms, after the gallery's own (--pytest-arg=--cudaopt-warmup=0.5)")
    parser.add_argument("--pytest-cache", action="store_true",
                        help="let the pytest arm use the judge's object cache too (the CPU smoke test, for time)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    if args.combine:
        return _show(*combine([Path(f) for f in args.combine]), out)
    shutil.rmtree(out / "work", ignore_errors=True)
    (out / "pytest").mkdir(parents=True, exist_ok=True)
    gallery, pytest_args = (cpu_gallery, CPU_ARGS) if args.smoke else (gpu_gallery, GPU_ARGS)

    def make(dest: Path, copies: int = 1) -> list[Path]:
        extra = [_finish(Path(shutil.copytree(Path(src).resolve(), dest / Path(src).name))) for src in args.extra]
        more = [w for n in range(2, copies + 1) for w in gpu_gallery(dest, n)] if not args.smoke else []
        return [*gallery(dest), *extra, *more]

    pytest_args = [*pytest_args, *args.pytest_arg]
    if args.skip_memsafety:
        pytest_args = [*pytest_args, "-k", "not test_memory_safety"]
    if args.sandbox:
        pytest_args = [*pytest_args, f"--cudaopt-sandbox={args.sandbox}"]
    cache = Path(args.cache_dir).resolve() if args.cache_dir else out / "work" / "judge-cache"
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus else None
    pytest_run = judge_run = None

    def run_pytest_arm() -> dict:
        workdirs = make(out / "work" / "pytest")[::max(1, args.pytest_sample)]
        if args.pytest_part:
            part, parts = (int(n) for n in args.pytest_part.split("/"))
            workdirs = workdirs[part - 1::parts]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   TORCHINDUCTOR_CACHE_DIR=str(out / "work" / "inductor-pytest"),
                   TRITON_CACHE_DIR=str(out / "work" / "triton-pytest"))
        if gpus and not args.smoke:
            env["CUDA_VISIBLE_DEVICES"] = gpus[0]
        if args.pytest_cache:
            env["CUDAOPT_OBJECT_CACHE"] = str(cache / "objects")
        return pytest_arm(workdirs, pytest_args, out / "pytest", env, progress=out / "judge_gallery.json")

    def run_judge_arm() -> dict:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        return judge_arm(make(out / "work" / "judge", args.copies), pytest_args, cache, gpus, out,
                         fork=not args.no_fork, share=args.share, turns=not args.no_turns, ahead=args.ahead)

    if args.judge_first and args.arm in ("both", "judge"):
        judge_run = run_judge_arm()
    if args.arm in ("both", "pytest"):
        pytest_run = run_pytest_arm()
    if not args.judge_first and args.arm in ("both", "judge"):
        judge_run = run_judge_arm()
    (out / "judge_gallery.json").write_text(json.dumps({"pytest": pytest_run, "judge": judge_run}, default=str))
    return _show(pytest_run, judge_run, out, devices=1 if args.smoke else None)


def combine(files: list[Path]) -> tuple[dict | None, dict | None]:
    """The pytest arms of several runs as one (their sessions ran one after another) and the last judge arm."""
    pytest_run = judge_run = None
    for path in files:
        if path.suffix == ".jsonl":
            judge_run = judge_lines(path)
            continue
        doc = json.loads(path.read_text())
        if doc.get("pytest"):
            pytest_run = pytest_run or {"wall_s": 0.0, "results": {}}
            pytest_run["wall_s"] += doc["pytest"]["wall_s"]
            pytest_run["results"].update(doc["pytest"]["results"])
        judge_run = doc.get("judge") or judge_run
    return pytest_run, judge_run


def judge_lines(path: Path) -> dict:
    """A judge arm from its lines as they came (judge.jsonl), the run cut or not: the workdirs judged by then, its wall
    the last line's `seconds.total` (from the judge's start), no busy fractions."""
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    return {"wall_s": max((line["seconds"].get("total", 0.0) for line in lines), default=0.0), "busy": {},
            "from_lines": str(path), "results": {Path(line["workdir"]).name: line for line in lines}}


def _show(pytest_run: dict | None, judge_run: dict | None, out: Path, devices: int | None = None) -> int:
    devices = devices or max(1, len(judge_run["busy"]) if judge_run else 1)
    text, same = table(pytest_run, judge_run, devices)
    out.mkdir(parents=True, exist_ok=True)
    (out / "judge_gallery.txt").write_text(text + "\n")
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
