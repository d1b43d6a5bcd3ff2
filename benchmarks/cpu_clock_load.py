"""The CPU timing's verdicts on a busy host: honest CPU kernels (cpu_problems: KernelBench's layer norm, batch
norm, linear+ReLU and matmul) and the timer attacks of tests/exploits (timer_patch, ping_stall, timer_shave,
with their honest twin honest_spin), their perf items run beside BUSY processes that spin a core each.

    python3 benchmarks/cpu_clock_load.py [--busy 0,3] [--out DIR]

One row a workdir: the perf verdict, timed calls, calls short past their allowance, calls raised, and the
reason. An honest row must show no short call; an attack row "own timer under-reports its time".
The test suite's built copies (build/test-workdirs) are used: run the suite once first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import support  # noqa: E402

PROBLEMS = support.WORKDIRS / "cpu_problems" / "variants"
HONEST = {"layer_norm": (), "batch_norm": ("model.py", "honest.py"), "linear_relu": ("model.py", "honest.py"),
          "matmul": ("model.py", "naive.py")}
ATTACKS = ("timer_patch", "ping_stall", "timer_shave", "honest_spin")


def _plant(root: Path) -> list[str]:
    for name, files in HONEST.items():
        dest = root / name
        shutil.copytree(support.PREBUILT_ROOT / "cpu_problems", dest, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        for target, source in zip(("model.py", "model_new.py"), files):
            shutil.copyfile(PROBLEMS / name / source, dest / target)
    for name in ATTACKS:
        support.attack_workdir(lambda workdir: support.PREBUILT_ROOT / workdir, name, root / name)
    return [*HONEST, *ATTACKS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", default="0,3", help="busy processes beside each run, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("out/cpu_clock_load"))
    opts = parser.parse_args()
    for busy in (int(b) for b in opts.busy.split(",")):
        root = (opts.out / f"busy{busy}").resolve()
        shutil.rmtree(root, ignore_errors=True)
        names = _plant(root)
        report = root / "report.json"
        cmd = [sys.executable, "-m", "pytest", *support.plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly",
               f"--cudaopt-report={report}", "--cudaopt-device=cpu", "--cudaopt-compile-backend=eager", "-m", "perf",
               *[f"{name}/model_new.py" for name in names]]
        with support.busy_cores(busy) if busy else contextlib.nullcontext():
            subprocess.run(cmd, cwd=root, env=support.subprocess_env(), capture_output=True, timeout=3600)
        print(f"\n{busy} busy processes beside the run")
        print(f"{'workdir':<12} {'verdict':<7} {'timed':>6} {'short':>6} {'raised':>6}  reason")
        for result in json.loads(report.read_text())["results"]:
            if result["kind"] == "perf":
                data, clock = result["data"], result["data"]["clock"]
                print(f"{Path(data['workdir']).name:<12} {'pass' if data['passed'] else 'FAIL':<7} "
                      f"{clock['timed_calls']:>6} {clock['short_calls']:>6} {clock['raised_calls']:>6}  "
                      f"{(data['gate'].get('reason') or '')[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
