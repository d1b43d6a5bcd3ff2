"""The attack workdirs judged by two trees' plugins on the CPU: every item's outcome side by side.

    python3 benchmarks/attacks_vs.py BEFORE [AFTER] --out DIR     # AFTER defaults to this checkout

The workdirs are this checkout's: each attack file of tests/exploits/ planted in its example workdir
(tests/workdirs/cpu_attacks or cpu_isolation) for each of its CPU sessions, the sandbox escapes of
tests/workdirs/cpu_attacks/variants/escape_*, and the honest and wrong controls. The workdirs of one
kind are judged in one `pytest` session per tree (the plugin imported from that tree through
PYTHONPATH), with the CPU arguments of the attack sessions. Left out: the GPU attacks (gpu_perf, run by
`pytest tests/exploits -m gpu` on a GPU), the scripted-clock sessions (isolation_perf) and the judge's
(judge). Printed: each session's exit status and time, the items whose outcome differs, then a
count. DIR keeps the planted workdirs, each tree's verdict files and output, and table.txt (every
item's outcome in both). Exit 0 when every item is the same.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPLOITS, WORKDIRS = ROOT / "tests" / "exploits", ROOT / "tests" / "workdirs"
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(EXPLOITS)]   # this checkout, the suite's support, _expect.py
from support import JUDGE_CPU_ARGS, copy_workdir, junit_cases  # noqa: E402

from pytest_cudaopt.launch import plugin_args  # noqa: E402 - -p pytest_cudaopt.plugin unless an entry point loads it
# session kind -> (example workdir, pytest's -m, extra environment)
KINDS = {"cpu_attacks": ("cpu_attacks", "correctness or perf", {}),
         "sandboxed": ("cpu_attacks", "correctness or perf", {}),
         "perf_alone": ("cpu_attacks", "perf", {}),
         "isolation": ("cpu_isolation", "correctness", {}),
         "dispatcher": ("cpu_isolation", "correctness", {"CUDAOPT_ISOLATION_OVERRIDE_AT_IMPORT": "1"})}
CONTROLS = {"cpu_attacks": {"honest": {"model_new.py": "variants/honest.py"}, "wrong": {},
                            "honest_spin": {"model_new.py": "variants/honest_spin.py"}},
            "isolation": {"honest": {}}, "dispatcher": {"honest": {}}}


def cases() -> dict[tuple[str, tuple], dict[str, dict]]:
    """(kind, extra pytest arguments) -> {workdir name: files (path in it -> sources in the example)}."""
    groups: dict[tuple[str, tuple], dict[str, dict]] = {}
    for path in sorted(EXPLOITS.glob("[a-z]*.py")):
        if path.name.startswith("test_"):
            continue
        attack = runpy.run_path(str(path))
        for kind, spec in attack["SESSIONS"].items():
            if kind in KINDS:
                groups.setdefault((kind, tuple(spec.get("args", ()))), {})[path.stem] = \
                    spec.get("files", attack.get("FILES", {}))
    escapes = groups.setdefault(("cpu_attacks", ()), {})
    for variant in sorted((WORKDIRS / "cpu_attacks" / "variants").glob("escape_*")):
        target = f"kernels/{variant.name}" if variant.suffix == ".cpp" else "model_new.py"
        escapes[variant.stem] = {target: f"variants/{variant.name}"}
    for kind, controls in CONTROLS.items():
        groups.setdefault((kind, ()), {}).update(controls)
    return groups


def plant(example: str, dest: Path, files: dict) -> None:
    """tests/workdirs/<example> at `dest` as the test suite copies it (with its fixed files and lock),
    each path of `files` written with its sources (one, or several concatenated)."""
    copy_workdir(example, dest)
    for target, sources in files.items():
        parts = (sources,) if isinstance(sources, str) else sources
        (dest / target).write_text("".join((WORKDIRS / example / part).read_text() for part in parts))
    if example == "cpu_isolation":
        shutil.rmtree(dest / "variants", ignore_errors=True)


def judge(tree: Path, folder: Path, names: list[str], marker: str, args: tuple, env: dict, plugin: list) -> dict:
    """One pytest session of `tree`'s plugin over `folder`'s workdirs `names`."""
    (folder / "pytest.ini").write_text("[pytest]\ncudaopt_device = cpu\n")
    cmd = [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider",
           "-p", "no:randomly", "-m", marker, "--junitxml=junit.xml", "--cudaopt-report=report.json",
           *JUDGE_CPU_ARGS, *args, *[f"{name}/model_new.py" for name in names]]
    run_env = {**os.environ, **env, "PYTHONPATH": str(tree)}
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=folder, env=run_env, capture_output=True, text=True, timeout=3600)
    (folder / "output.txt").write_text(done.stdout + done.stderr)
    junit = folder / "junit.xml"
    return {"status": done.returncode, "seconds": time.monotonic() - t0,
            "items": {key: outcome for key, (outcome, _) in junit_cases(junit).items()} if junit.is_file() else {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path, nargs="?", default=ROOT)
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args()
    trees = {"before": opts.before.resolve(), "after": opts.after.resolve()}
    rows, same, lines = [], 0, []
    for index, ((kind, args), workdirs) in enumerate(cases().items()):
        example, marker, env = KINDS[kind]
        group = kind if not args else f"{kind}-{index}"   # a kind judged with arguments of its own
        runs = {}
        for label, tree in trees.items():
            folder = opts.out / label / group
            shutil.rmtree(folder, ignore_errors=True)
            for name, files in workdirs.items():
                plant(example, folder / name, files)
            runs[label] = judge(tree, folder, sorted(workdirs), marker, args, env, plugin_args())
            print(f"{group:<20} {label:<6} {len(workdirs):>2} workdirs  {len(runs[label]['items']):>3} items  "
                  f"exit {runs[label]['status']}  {runs[label]['seconds']:.0f} s", flush=True)
        for key in sorted(set(runs["before"]["items"]) | set(runs["after"]["items"])):
            before, after = (runs[label]["items"].get(key, "absent") for label in ("before", "after"))
            rows.append((group, *key, before, after))
            same += before == after
    width = max(len(f"{g} {w}/{i}") for g, w, i, _, _ in rows) if rows else 10
    lines.append(f"{'item':<{width}}  before   after")
    lines += [f"{f'{g} {w}/{i}':<{width}}  {b:<8} {a}" for g, w, i, b, a in rows]
    lines.append(f"{same} of {len(rows)} items the same; differing: "
                 + (", ".join(f"{g} {w}/{i}" for g, w, i, b, a in rows if b != a) or "none"))
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "table.txt").write_text("\n".join(lines) + "\n")
    print("\n".join([lines[0], *[line for line, (_, _, _, b, a) in zip(lines[1:], rows) if b != a], lines[-1]]))
    return 0 if rows and same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
