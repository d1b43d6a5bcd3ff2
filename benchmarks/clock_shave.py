"""Workers that under-report their time, against their honest twins: one `pytest -m perf` session per tree, and `cudaopt judge`.

    python3 benchmarks/clock_shave.py --out DIR [--tree before=PATH] [--judge] [--gallery] [--default]

Workdirs (benchmarks/workdirs/clock_shave, a row softmax): honest at 640 x 4096 (~16 us) and
64 x 4096 (~6 us); at 640 x 4096 with torch.cuda.Event.elapsed_time shaved by 2%, 50% and 95%,
from model_new.py (computed names) and from the extension's C++ (a detour of cudaEventElapsedTime).
--gallery adds the honest kernels of benchmarks/gallery/gpu; --default the tree's own workdir.
Each tree (this checkout's, "after", and any --tree NAME=PATH, a checkout of another commit) judges
the same copies with its own plugin; --judge runs this tree's `cudaopt judge` over the small
softmaxes too. Prints a table last; OUT/clock_shave.json holds every figure.
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
SOURCE = ROOT / "benchmarks" / "workdirs" / "clock_shave"
SOFTMAX = ROOT / "benchmarks" / "workdirs" / "kb_softmax" / "kernels"
TEMPLATES = ROOT / "pytest_cudaopt" / "templates"
ARGS = ["--cudaopt-max-time=2", "--cudaopt-warmup=0.2", "--cudaopt-min-speedup=0.8"]
DEFAULT_ARGS = ["--cudaopt-max-time=10"]
SHAVES = [("python", 0.02), ("python", 0.5), ("python", 0.95), ("cpp", 0.02), ("cpp", 0.5), ("cpp", 0.95)]


def _finish(workdir: Path) -> Path:
    for name in ("binding.cpp", "binding_registry.h"):
        if not (workdir / name).is_file():
            shutil.copyfile(TEMPLATES / name, workdir / name)
    shutil.copytree(TEMPLATES / "utils", workdir / "utils", dirs_exist_ok=True)
    return workdir


def softmax(dest: Path, name: str, rows: int = 640, shave: float = 0.0, how: str = "python") -> Path:
    workdir = dest / name
    shutil.copytree(SOURCE, workdir)
    for kernel in SOFTMAX.iterdir():
        shutil.copyfile(kernel, workdir / "kernels" / kernel.name)
    model = workdir / "model.py"
    model.write_text(model.read_text().replace("ROWS = 512", f"ROWS = {rows}"))
    new = workdir / "model_new.py"
    new.write_text(new.read_text().replace("SHAVE = 0.0", f"SHAVE = {shave}").replace('HOW = "python"', f'HOW = "{how}"'))
    return _finish(workdir)


def gallery(dest: Path) -> list[Path]:
    made = []
    for problem in sorted(p for p in (ROOT / "benchmarks" / "gallery" / "gpu").iterdir() if p.is_dir()):
        for kernel in problem.glob("*.honest.cu"):
            op = kernel.name.split(".")[0]
            workdir = dest / f"{problem.name}-honest"
            (workdir / "kernels").mkdir(parents=True)
            shutil.copyfile(problem / "model.py", workdir / "model.py")
            shutil.copyfile(problem / "model_new.py", workdir / "model_new.py")
            shutil.copyfile(kernel, workdir / "kernels" / f"{op}.cu")
            shutil.copyfile(problem / f"{op}_binding.cpp", workdir / "kernels" / f"{op}_binding.cpp")
            made.append(_finish(workdir))
    return made


def workdirs(dest: Path, with_gallery: bool) -> list[Path]:
    made = [softmax(dest, "softmax640-honest"), softmax(dest, "softmax64-honest", rows=64)]
    made += [softmax(dest, f"softmax640-{how}-{int(s * 100)}", shave=s, how=how) for how, s in SHAVES]
    return made + (gallery(dest) if with_gallery else [])


def session(tree: Path, paths: list[Path], cwd: Path, out: Path, name: str, args: list[str]) -> dict:
    """One pytest session of `tree`'s plugin over `paths`: its JSON report's perf results by workdir."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    report = out / f"{name}.json"
    command = [sys.executable, "-m", "pytest", *map(str, paths), "-p", "pytest_cudaopt.plugin", "-p",
               "no:cacheprovider", "-m", "perf", "-q", "-rA", f"--cudaopt-report={report}", *args]
    started = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        code = subprocess.call(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    print(f"{name}: exit {code}, {time.monotonic() - started:.0f} s", flush=True)
    try:
        doc = json.loads(report.read_text())
    except (OSError, ValueError):
        return {}
    found = {}
    for item in doc.get("results", []):
        if item.get("kind") != "perf":
            continue
        data = item.get("data", item)
        gate, clock = data.get("gate") or {}, data.get("clock") or {}
        found[Path(data["workdir"]).name] = {
            "passed": data.get("passed"), "custom_s": gate.get("custom_median_s"),
            "compile_s": gate.get("baseline_median_s"), "speedup": gate.get("speedup"),
            "reason": (data.get("failure") or gate.get("reason") or "")[:300],
            "warnings": " ".join(data.get("figure_warnings") or [])[:300], "clock": clock}
    return found


def judge(paths: list[Path], out: Path) -> dict:
    lines = out / "judge.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    folder = paths[0].parent
    command = [sys.executable, "-m", "pytest_cudaopt.cli", "judge", str(folder), "--all-stages", "--out", str(lines),
               "--no-cache", "--", *ARGS]
    started = time.monotonic()
    with open(out / "judge.log", "w") as log:
        code = subprocess.call(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    print(f"judge: exit {code}, {time.monotonic() - started:.0f} s", flush=True)
    found = {}
    for raw in lines.read_text().splitlines() if lines.is_file() else []:
        line = json.loads(raw)
        found[Path(line["workdir"]).name] = {"passed": line.get("passed"), "verdicts": line.get("verdicts"),
                                             "reason": (line.get("reason") or "")[:300]}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH: another checkout's plugin")
    parser.add_argument("--judge", action="store_true")
    parser.add_argument("--gallery", action="store_true")
    parser.add_argument("--default", action="store_true")
    parser.add_argument("--only-honest", action="store_true", help="the other trees judge the honest workdirs only")
    parser.add_argument("--no-pytest", action="store_true", help="no pytest sessions: the judge only")
    ns = parser.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    trees = [("after", ROOT)] + [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in ns.tree]
    scratch = ns.out / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    made = workdirs(scratch / "workdirs", ns.gallery)
    results: dict = {}
    for name, tree in trees if not ns.no_pytest else ():
        paths = [p for p in made if name == "after" or not ns.only_honest or p.name.endswith("-honest")]
        results[name] = session(tree, [p / "model_new.py" for p in paths], scratch, ns.out, name, ARGS)
        if ns.default:
            results[name].update({f"default-{k}": v for k, v in session(
                tree, [tree / "model_new.py"], tree, ns.out, f"{name}-default", DEFAULT_ARGS).items()})
        (ns.out / "clock_shave.json").write_text(json.dumps(results, indent=1))   # a run cut short keeps these
    if ns.judge:
        folder = scratch / "judged"
        folder.mkdir()
        for path in made:
            if path.name.startswith("softmax640"):
                shutil.copytree(path, folder / path.name)
        results["judge"] = judge(sorted(folder.iterdir()), ns.out)
    (ns.out / "clock_shave.json").write_text(json.dumps(results, indent=1))
    print(f"\n{'tree':7} {'workdir':26} {'pass':5} {'custom us':>10} {'compile us':>10} {'speedup':>7} "
          f"{'short':>9} {'shift us':>8}  reason")
    for name, found in results.items():
        if name == "judge":
            continue
        for workdir, r in sorted(found.items()):
            c = r["clock"]
            short = f"{c.get('short_calls', '-')}/{c.get('timed_calls', '-')}" if c else "-"
            shift = c.get("median_shift_s") if c else None
            reason = re.sub(r"\s+", " ", r["reason"])[:90]
            print(f"{name:7} {workdir:26} {str(r['passed']):5} {(r['custom_s'] or 0) * 1e6:10.2f} "
                  f"{(r['compile_s'] or 0) * 1e6:10.2f} {r['speedup'] or 0:7.3f} {short:>9} "
                  f"{'-' if shift is None else '%.1f' % (shift * 1e6):>8}  {reason}")
    for workdir, r in sorted(results.get("judge", {}).items()):
        print(f"judge   {workdir:26} {str(r['passed']):5} {r['verdicts']}  {r['reason'][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
