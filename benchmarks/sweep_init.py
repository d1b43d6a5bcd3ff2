"""Run `cudaopt init` and `cudaopt check` (whose MN010 constructs ModelNew on the CPU) over
every KernelBench level 1-3 problem, and count the problems whose new workdir passes.

    python benchmarks/sweep_init.py KERNELBENCH_DIR [--limit 120] [--every 1] [--cpu-only]

KERNELBENCH_DIR is a KernelBench checkout (the folder holding KernelBench/level1, or that
folder itself); nothing of it is copied here. Each problem runs in a forked child with a time
limit, in a workdir of its own under a temporary folder, so that one slow or crashing model
cannot stop the sweep. Prints the per-level counts, then every failure with the lines of
`cudaopt check`, and exits 1 when any problem fails (a problem whose model.py itself does
not load here, a module that is not installed, counts as a failure too: it was not judged).
--cpu-only builds the models on the CPU alone (no meta device first), to compare the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

LEVELS = ("level1", "level2", "level3")


def problems(root: Path) -> list[Path]:
    base = root / "KernelBench" if (root / "KernelBench").is_dir() else root
    found = [path for level in LEVELS for path in sorted((base / level).glob("*.py"))]
    if not found:
        raise SystemExit(f"sweep_init: {root}: no KernelBench/level1-3/*.py files (give the path of a "
                         "KernelBench checkout)")
    return found


def judge(path: Path) -> dict:
    """`cudaopt init` around `path`, then the rules on the new workdir (MN010 included)."""
    from pytest_cudaopt import policy
    from pytest_cudaopt.commands import scaffold

    with tempfile.TemporaryDirectory(prefix="sweep_init_") as tmp:
        try:
            workdir = scaffold.init_workdir(Path(tmp) / "wd", path, [])
        except scaffold.ScaffoldError as exc:
            return {"lines": [f"cudaopt init: {exc}"], "reference": False, "seconds": 0.0}
        started = time.perf_counter()
        violations = policy.check_workdir(workdir)
        seconds = time.perf_counter() - started
    return {"lines": [str(v) for v in violations], "seconds": seconds,
            # model.py itself does not import or construct here: not a finding about init.
            "reference": bool(violations) and all(v.rule == "MN010" and v.path == "model.py" for v in violations)}


def in_child(path: Path, limit: float, work=None) -> dict:
    """`work(path)` (default: judge) in a forked child with its output silenced, killed after
    `limit` seconds."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            data = json.dumps((work or judge)(path))
        except BaseException as exc:  # noqa: BLE001 - reported as the problem's failure
            data = json.dumps({"lines": [f"sweep: {type(exc).__name__}: {exc}"], "reference": False})
        with os.fdopen(write, "w") as out:
            out.write(data)
        os._exit(0)
    os.close(write)
    deadline, chunks = time.monotonic() + limit, []
    os.set_blocking(read, False)  # read while the child runs: a full pipe would block its write
    with os.fdopen(read, "rb") as inp:
        while True:
            done = os.waitpid(pid, os.WNOHANG)[0]
            try:
                chunks.append(inp.read() or b"")
            except BlockingIOError:
                pass
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"lines": [f"sweep: over the {limit:.0f} s limit"], "reference": False}
            time.sleep(0.02)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return {"lines": ["sweep: the child ended without a result (a crash in the model's code?)"],
                "reference": False}


def report(outcomes: dict[str, dict], seconds: float, cpu_only: bool) -> int:
    """Print the per-level counts and the failures; the exit code."""
    for level in LEVELS:
        mine = {k: v for k, v in outcomes.items() if k.startswith(level + "/")}
        passed = sum(not v["lines"] for v in mine.values())
        print(f"{level}: {passed} of {len(mine)} pass `cudaopt init` + `cudaopt check` (ModelNew constructs)")
    failed = {k: v for k, v in outcomes.items() if v["lines"]}
    for label, outcome in failed.items():
        kind = "model.py itself fails here (not judged)" if outcome["reference"] else "FAIL"
        print(f"{kind}: {label}")
        for line in outcome["lines"]:
            print(f"    {line}"[:400])
    timed = sorted((v["seconds"], k) for k, v in outcomes.items() if "seconds" in v)
    if timed:
        slowest = ", ".join(f"{k} {s:.2f} s" for s, k in reversed(timed[-3:]))
        print(f"cudaopt check per problem ({'CPU only' if cpu_only else 'meta device, else the CPU'}): "
              f"median {statistics.median(s for s, _ in timed):.3f} s, sum {sum(s for s, _ in timed):.1f} s; "
              f"slowest: {slowest}")
    print(f"total: {len(outcomes) - len(failed)} of {len(outcomes)} pass; {seconds:.0f} s")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path, help="a KernelBench checkout")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds per problem before it fails")
    parser.add_argument("--every", type=int, default=1, help="a deterministic sample: every Nth problem")
    parser.add_argument("--cpu-only", action="store_true", help="build the models on the CPU alone")
    args = parser.parse_args(argv)
    paths = problems(args.kernelbench)[::max(1, args.every)]
    warnings.simplefilter("ignore")
    import torch

    from pytest_cudaopt import policy  # noqa: F401  (imported once, before the children fork)
    from pytest_cudaopt.candidate import construct

    torch.set_num_threads(1)  # no thread pool to inherit across fork (a forked child could hang on it)
    if args.cpu_only:
        construct.DEVICES = ("cpu",)
    started = time.perf_counter()
    outcomes = {f"{p.parent.name}/{p.name}": in_child(p, args.limit) for p in paths}
    return report(outcomes, time.perf_counter() - started, args.cpu_only)


if __name__ == "__main__":
    sys.exit(main())
