"""The judge as a warm service under a steady stream of workdirs: throughput, latency from submission to line, and time by stage.

    python3 benchmarks/judge_latency.py FOLDER --per-hour 600 --count 200 [--gpus 0,1] [--out OUT.json]
    python3 benchmarks/judge_latency.py FOLDER --per-second 0.5 --count 4 --cpu [-- PYTEST_ARGS]    # CPU dry run

FOLDER holds workdirs (any depth); they are submitted to one `Service` in turn (again from the
first once all were), one every 1/rate seconds, --count in all. Printed: workdirs per device-hour
(lines over the wall time from the first submission to the last line, times the devices), p50 and
p95 of each line's `seconds.total` (submission to line), `queued` and `judging`, the mean seconds of
each stage (`seconds`) and where the time went (`time`), and the statuses. --out keeps the lines
and the summary as JSON. Exit 0 when every submission got exactly one line, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pytest_cudaopt runs from the checkout, uninstalled (its children too)
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

CPU_ARGS = ["--cudaopt-device=cpu", "--cudaopt-compile-backend=eager", "--cudaopt-max-time=1", "--cudaopt-warmup=0.1",
            "--cudaopt-min-runs=5", "--cudaopt-max-examples=5"]
STAGES = ("copy", "build", "policy", "check", "perf")


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p95 (statistics.quantiles, inclusive: exact for a handful of values too)."""
    if not values:
        return {"p50": None, "p95": None}
    if len(values) == 1:
        return {"p50": values[0], "p95": values[0]}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49], 3), "p95": round(cuts[94], 3)}


def summarize(found: list[dict], wall_s: float, devices: int) -> dict:
    """Throughput, latency percentiles, mean time by stage and where the time went, statuses."""
    seconds = [line["seconds"] for line in found]
    spent: dict[str, list[float]] = {}
    for line in found:
        for key, value in (line.get("time") or {}).items():
            spent.setdefault(key, []).append(value)
    statuses: dict[str, int] = {}
    for line in found:
        statuses[line["status"]] = statuses.get(line["status"], 0) + 1
    return {
        "lines": len(found), "passed": sum(bool(line["passed"]) for line in found), "wall_s": round(wall_s, 3),
        "devices": devices, "per_device_hour": round(len(found) / max(wall_s, 1e-9) * 3600 / devices, 1),
        "latency": {part: percentiles([s.get(part, 0.0) for s in seconds]) for part in ("total", "queued", "judging")},
        "stages_mean_s": {stage: round(statistics.fmean([s.get(stage, 0.0) for s in seconds]), 3) if seconds else None
                          for stage in STAGES},
        "time_mean_s": {key: round(statistics.fmean(values), 3) for key, values in sorted(spent.items())},
        "statuses": statuses,
    }


def report(summary: dict) -> str:
    lat = summary["latency"]
    rows = [f"{summary['lines']} lines ({summary['passed']} passed) in {summary['wall_s']:.1f} s on "
            f"{summary['devices']} device(s): {summary['per_device_hour']:.1f} workdirs per device-hour",
            *(f"  {part:8s} p50 {lat[part]['p50']} s  p95 {lat[part]['p95']} s" for part in lat),
            "  stages (mean s): " + ", ".join(f"{k} {v}" for k, v in summary["stages_mean_s"].items()),
            "  time (mean s):   " + ", ".join(f"{k} {v}" for k, v in summary["time_mean_s"].items()),
            "  statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items()))]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passed_on = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder holding workdirs")
    rate = parser.add_mutually_exclusive_group(required=True)
    rate.add_argument("--per-hour", type=float, help="submissions per hour")
    rate.add_argument("--per-second", type=float, help="submissions per second")
    parser.add_argument("--count", type=int, default=None, help="submissions in all (default: each workdir once)")
    parser.add_argument("--gpus", default=None, help="GPU indices, comma separated (default: every visible GPU)")
    parser.add_argument("--cpu", action="store_true", help="CPU workdirs: short CPU settings, --cpu-slots devices")
    parser.add_argument("--cpu-slots", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0, help="each child's limit (default 600)")
    parser.add_argument("--cache-dir", default=None, help="the object and torch.compile caches (default: the judge's)")
    parser.add_argument("--out", default=None, help="a JSON file for the lines and the summary")
    args = parser.parse_args(argv)

    from pytest_cudaopt.judge import Options, Service, find_workdirs

    workdirs, problems = find_workdirs([args.folder])
    if not workdirs:
        parser.error(f"{args.folder} holds no workdir: {problems}")
    per_second = args.per_second if args.per_second is not None else args.per_hour / 3600.0
    if per_second <= 0:
        parser.error("the rate must be above 0")
    count = args.count if args.count is not None else len(workdirs)
    options = Options(gpus=args.gpus.split(",") if args.gpus else None, cpu_slots=args.cpu_slots, timeout=args.timeout,
                      pytest_args=[*(CPU_ARGS if args.cpu else []), *passed_on])
    if args.cache_dir:
        options.cache_dir = Path(args.cache_dir)
    with Service(options) as service:
        devices = len(service.devices)
        start = time.monotonic()
        futures = []
        for n in range(count):
            time.sleep(max(0.0, start + n / per_second - time.monotonic()))
            futures.append(service.submit(workdirs[n % len(workdirs)], id=n))
        found = [future.result() for future in futures]
        wall_s = time.monotonic() - start
    summary = summarize(found, wall_s, devices)
    print(report(summary))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rate_per_s": per_second, "lines": found}, indent=1))
    return 0 if sorted(line["id"] for line in found) == list(range(count)) else 1


if __name__ == "__main__":
    sys.exit(main())
