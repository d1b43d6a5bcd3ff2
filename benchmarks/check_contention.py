"""What a judge's checks on one GPU wait on when they share it: N check sessions of one gallery workdir (N built
copies) started together, each as a judge's check runs (`pytest -m "not perf and not policy"`, the gallery's
settings, the workers forked from a zygote), then the same without the memory-safety item (`-m correctness`), and
the memory-safety item alone (`-m memsafety`). Per run: each session's wall and its items' seconds by kind (JUnit),
the CPU's busy cores and the GPU's utilisation meanwhile (sampled every 0.2 s).

    python3 benchmarks/check_contention.py [--problem gelu --variant honest] [--counts 1 4 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MARKERS = {"check": "not perf and not policy", "correctness": "correctness", "memsafety": "memsafety"}


def _cpu_times() -> tuple[float, float]:
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _sample(stop: threading.Event, into: dict) -> None:
    """Busy cores (from /proc/stat) and the GPU's utilisation (nvidia-smi), every 0.2 s until `stop`."""
    cores = os.cpu_count() or 1
    busy, gpu = [], []
    last = _cpu_times()
    while not stop.wait(0.2):
        now = _cpu_times()
        if now[1] > last[1]:
            busy.append(cores * (now[0] - last[0]) / (now[1] - last[1]))
        last = now
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=2).stdout.split()
            gpu.append(float(out[0]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    into["busy_cores"] = statistics.mean(busy) if busy else None
    into["busy_cores_p90"] = sorted(busy)[int(0.9 * (len(busy) - 1))] if busy else None
    into["gpu_util"] = statistics.mean(gpu) if gpu else None


def run_batch(workdirs: list[Path], kind: str, args: list[str], out: Path, env: dict) -> dict:
    """The sessions of `workdirs` (one each) started together; each one's wall and items' seconds by kind."""
    from pytest_cudaopt.judge.stages import read_junit
    from pytest_cudaopt.launch import pytest_command

    out.mkdir(parents=True, exist_ok=True)
    stop, sampled = threading.Event(), {}
    sampler = threading.Thread(target=_sample, args=(stop, sampled))
    sampler.start()
    procs, started = [], time.monotonic()
    for n, workdir in enumerate(workdirs):
        junit = out / f"{n}.xml"
        command = pytest_command([str(workdir / "model_new.py"), "--rootdir", str(workdir), "-p", "no:cacheprovider",
                                  "-p", "no:benchmark", "-q", "-m", MARKERS[kind], f"--junitxml={junit}",
                                  f"--cudaopt-report={out / f'{n}.json'}", *args])
        log = open(out / f"{n}.log", "w")
        procs.append((subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT), log,
                      junit))
    sessions = []
    for proc, log, junit in procs:
        code = proc.wait()
        log.close()
        kinds: dict[str, float] = {}
        for case in read_junit(junit):
            kinds[case["kind"]] = round(kinds.get(case["kind"], 0.0) + case["seconds"], 3)
        sessions.append({"exit": code, "wall_s": round(time.monotonic() - started, 2), "items": kinds})
    stop.set()
    sampler.join()
    return {"kind": kind, "count": len(workdirs), "wall_s": round(time.monotonic() - started, 2),
            "sessions": sessions, **sampled}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="gelu")
    parser.add_argument("--variant", default="honest")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 4, 6])
    parser.add_argument("--kinds", nargs="+", default=list(MARKERS), choices=list(MARKERS))
    parser.add_argument("--out", type=Path, default=Path("out"))
    opts = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import judge_gallery

    out = opts.out.resolve()
    workdirs = []
    for copy in range(1, max(opts.counts) + 1):
        made = judge_gallery.gpu_gallery(out / "workdirs" / str(copy), copy)
        workdirs += [w for w in made if w.name.startswith(f"{opts.problem}-{opts.variant}")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t = time.monotonic()
    builds = [subprocess.Popen([sys.executable, "-m", "pytest_cudaopt.cli", "build", str(w)], cwd=w, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for w in workdirs]
    codes = [b.wait() for b in builds]
    print(f"built {len(workdirs)} copies in {time.monotonic() - t:.1f} s, exits {codes}", flush=True)
    if any(codes):
        return 1
    name = f"check-contention-{os.getpid()}"
    zygote = subprocess.Popen([sys.executable, "-m", "pytest_cudaopt.run.zygote", name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=dict(env, PYTHONPATH=str(ROOT)), start_new_session=True,
                              cwd=ROOT)
    zygote.stdout.readline()
    env["CUDAOPT_WORKER_ZYGOTE"] = name
    rows = []
    try:
        for kind in opts.kinds:
            for count in opts.counts:
                row = run_batch(workdirs[:count], kind, judge_gallery.GPU_ARGS, out / f"{kind}-{count}", env)
                rows.append(row)
                items = {k: statistics.median(s["items"].get(k, 0.0) for s in row["sessions"])
                         for k in ("build", "correctness", "memsafety")}
                walls = [s["wall_s"] for s in row["sessions"]]
                print(f"{kind:12s} x{count}: wall {row['wall_s']:6.1f} s, session median "
                      f"{statistics.median(walls):5.1f} s"
                      f"; items (median s) " + ", ".join(f"{k} {v:.2f}" for k, v in items.items())
                      + f"; busy cores {row['busy_cores'] or 0:.1f} (p90 {row['busy_cores_p90'] or 0:.1f}), "
                      f"GPU {row['gpu_util'] or 0:.0f}%; exits {[s['exit'] for s in row['sessions']]}", flush=True)
    finally:
        zygote.stdin.close()
        zygote.wait()
        (out / "check_contention.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
