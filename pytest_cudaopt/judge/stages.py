"""One stage of one workdir as a child process: its command line and environment, and what its exit, JSON report and JUnit file say."""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_cudaopt.judge import copies, runner
from pytest_cudaopt.judge.devices import DeviceSet
from pytest_cudaopt.judge.options import Options
from pytest_cudaopt.launch import pytest_command, strict_sandbox
from pytest_cudaopt.run import zygote
from pytest_cudaopt.run.turn import Pause, Turn

# The pytest children: which items each runs, and the verdict kinds it must have collected.
MARKERS = {"policy": "policy", "check": "not perf and not policy", "perf": "perf"}
EXPECTED = {"policy": ("policy",), "check": ("correctness",), "perf": ("perf",)}
KIND_OF_CLASS = {"TestMemorySafety": "memsafety"}   # the others: TestPerf -> perf
# Stage statuses: ok, failed (a verdict failed), then what ended the child: build-failed,
# crashed (a signal, or no report), timeout, error (the judge's or the setup's trouble), not-run.
OK, FAILED = "ok", "failed"
# Builds yield the CPUs to the children that hold a device: a device waits on those, a build has time.
BUILD_NICE = 10


@dataclass
class StageResult:
    """What one stage's child ended with."""

    stage: str
    status: str
    seconds: float = 0.0
    device: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    report: dict | None = None
    cases: list[dict] = field(default_factory=list)   # JUnit: kind, name, outcome, seconds
    objects: dict[str, int] = field(default_factory=dict)
    tail: str = ""
    need_bytes: int | None = None   # the build's estimate of one check's device memory
    note: str = ""                  # what the judge did about the stage (a check retried alone)

    def to_json(self) -> dict[str, Any]:
        """The stage in the line: its items counted by kind and outcome, the failed ones named."""
        left_out = {"report", "stage", "cases", *(["tail"] if self.status == OK else [])}
        data = {k: v for k, v in asdict(self).items()
                if k not in left_out and not (k in ("objects", "need_bytes", "note") and v in (None, {}, ""))}
        counts: dict[str, dict[str, int]] = {}
        for case in self.cases:
            kind = counts.setdefault(case["kind"], {})
            kind[case["outcome"]] = kind.get(case["outcome"], 0) + 1
        data["items"] = counts
        data["failed"] = [f"{c['kind']} {c['name']}" for c in self.cases if c["outcome"] in ("failure", "error")]
        return data


def common_environment(options: Options) -> dict[str, str]:
    """What every child and the zygote that forks them get. Inductor compiles in the child's own process: its
    default, a pool of min(32, cores) worker processes per child that compiles, adds nothing where every core has
    a judge's child, and its shutdown at the child's exit takes seconds. Python's bytecode: in the folder the
    pool's zygote writes (`options.bytecode`, PYTHONPYCACHEPREFIX; run/zygote.py), which its children read."""
    keep = set(options.keep_env)
    given = {} if "TORCHINDUCTOR_COMPILE_THREADS" in keep else {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    if options.bytecode is not None:
        given["PYTHONPYCACHEPREFIX"] = str(options.bytecode)
    return given


def bytecode_folder(options: Options) -> Path | None:
    """Where a pool's zygote writes Python's bytecode: `<cache-dir>/bytecode` (none without a cache). A fresh
    Python (a sanitized child) then reads torch's compiled, where an install without bytecode compiles it each time."""
    return None if options.cache_dir is None else Path(options.cache_dir).expanduser().resolve() / "bytecode"


def environment(stage: str, devices: DeviceSet, device: str | None, options: Options) -> dict[str, str]:
    """A child's environment: the scrubbed base, its device, the host's shared caches."""
    given = {**common_environment(options), "CUDA_VISIBLE_DEVICES": "" if devices.cpu or device is None else device,
             "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if devices.arch_list and not os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip():
        given["TORCH_CUDA_ARCH_LIST"] = devices.arch_list
    if options.cache_dir is not None:
        cache = Path(options.cache_dir).expanduser().resolve()
        # Every child (not only the build): their in-process build writes the same build.ninja.
        given["CUDAOPT_OBJECT_CACHE"] = str(cache / "objects")
        given["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
        given["TRITON_CACHE_DIR"] = str(cache / "triton")
    else:  # --no-cache: not the per-user object cache either
        given["CUDAOPT_OBJECT_CACHE"] = "off"
    if options.zygote:
        given[zygote.ENV] = options.zygote
    if stage == "build":
        given["MAX_JOBS"] = str(max(1, (os.cpu_count() or 2) // max(1, options.cpu_jobs)))
    return copies.scrubbed_env(given, keep=options.keep_env)


def command(stage: str, copy: Path, out: Path, options: Options) -> list[str]:
    """The child's command line (`python -m MODULE ARGS`)."""
    if stage == "build":
        return [sys.executable, "-m", "pytest_cudaopt.judge.child_build", str(copy), *options.pytest_args]
    # --assert=plain: pytest rewrites the asserts of every module of a plugin's package as it imports it, and a child
    # writes no bytecode, so each child parsed and compiled ours afresh (1.2-1.8 s a child). None of its items asserts.
    args = [str(copy / "model_new.py"), "--rootdir", str(copy), "-m", MARKERS[stage], "-p", "no:cacheprovider",
            "-p", "no:benchmark", "--assert=plain", "-q", f"--cudaopt-report={out / f'{stage}.json'}",
            f"--junitxml={out / f'{stage}.xml'}", "-o", "junit_family=xunit2"]
    if stage != "policy":
        args.append("--cudaopt-ci-gate")   # a GPU item that would be skipped fails instead
    if options.seed is not None and stage != "policy":
        args.append(f"--cudaopt-seed={options.seed}")
    if stage == "perf" and (out / "check.json").is_file():   # the workdir's tier as a whole session finds it
        args.append(f"--cudaopt-correctness-report={out / 'check.json'}")
    args += strict_sandbox(options.pytest_args, env={})  # GPU workdirs: no candidate runs unconfined
    return pytest_command([*args, *options.pytest_args])


def run_stage(stage: str, copy: Path, out: Path, devices: DeviceSet, device: str | None, options: Options,
              children: runner.Children | None = None, turn: Turn | None = None,
              place: Turn | None = None, pause: Pause | None = None) -> StageResult:
    """Run one stage of the workdir at `copy` (outputs in `out`) and read what it left. `turn`: a perf stage's;
    `place`: a device stage's; `pause`: a check's (run/turn.py). The child's time limit grows by its waits
    for them and its pauses."""
    timeout = options.build_timeout if stage == "build" else options.timeout
    gates = [g for g in (place, turn, pause) if g is not None]
    env = environment(stage, devices, device, options)
    for gate in gates:
        env.update(gate.env)
    outcome = runner.run(command(stage, copy, out, options), env=env, cwd=out, timeout=timeout,
                         log=out / f"{stage}.log", children=children, grace=options.grace,
                         nice=BUILD_NICE if stage == "build" else 0,
                         zygote_name=options.zygote if options.fork else None,
                         paused=lambda: min(sum(g.waited() for g in gates), timeout))
    if stage == "build":
        result = read_build(outcome)
        result.objects = _object_counts(copy)
    else:
        result = read_pytest(stage, outcome, out / f"{stage}.json", out / f"{stage}.xml")
    result.device = device
    return result


def _object_counts(copy: Path) -> dict[str, int]:
    from pytest_cudaopt.extension import objcache

    total = {"hit": 0, "store": 0, "miss": 0}
    for folder in (copy / "build" / "cudaopt").glob("*"):
        for key, n in objcache.counts(folder).items():
            total[key] += n
    return {"cached": total["hit"], "compiled": total["store"] + total["miss"]}


def _ended(stage: str, outcome: runner.Outcome) -> StageResult | None:
    """A child the time limit or a signal ended."""
    if not outcome.timed_out and not outcome.signal:
        return None
    status, how = ("timeout", "ran past its time limit and was ended") if outcome.timed_out else (
        "crashed", f"was killed by {outcome.signal}")
    return StageResult(stage, status, outcome.seconds, exit_code=outcome.returncode, tail=outcome.tail,
                       reason=f"the {stage} stage {how}")


def read_build(outcome: runner.Outcome) -> StageResult:
    ended = _ended("build", outcome)
    if ended is not None:
        return ended
    from pytest_cudaopt.judge.child_build import NEED_MARK, REPORT_MARK, TIMEOUT_CODE

    if outcome.returncode == 0:
        try:
            found = [line[len(NEED_MARK):].strip() for line in outcome.log.read_text(errors="replace").splitlines()
                     if line.startswith(NEED_MARK)]
        except OSError:
            found = []
        need = int(found[-1]) if found and found[-1].isdigit() else None
        return StageResult("build", OK, outcome.seconds, exit_code=0, need_bytes=need)

    status = {1: "build-failed", TIMEOUT_CODE: "timeout"}.get(outcome.returncode, "error")
    tail = outcome.tail
    report = tail[tail.rindex(REPORT_MARK) + len(REPORT_MARK):].strip() if REPORT_MARK in tail else tail
    return StageResult("build", status, outcome.seconds, exit_code=outcome.returncode, tail=tail,
                       reason=report[-4000:] or f"the build ended with status {outcome.returncode}")


def read_junit(path: Path) -> list[dict]:
    """Each test case of a JUnit file: its verdict kind (from its class), name, outcome, seconds."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    cases = []
    for case in root.iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        kind = KIND_OF_CLASS.get(cls, cls.removeprefix("Test").lower() or "other")
        outcome = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed")
        cases.append({"kind": kind, "name": case.get("name", ""), "outcome": outcome,
                      "seconds": float(case.get("time") or 0.0)})
    return cases


def _read_report(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "schema" in doc and "passed" in doc and "results" in doc else None


def read_pytest(stage: str, outcome: runner.Outcome, report_path: Path, junit_path: Path) -> StageResult:
    """A pytest child's status: ok only when it exited 0, its report says passed and complete, and it collected
    the stage's verdict kinds, none all skipped."""
    report, cases = _read_report(report_path), read_junit(junit_path)
    result = _ended(stage, outcome) or StageResult(stage, OK, outcome.seconds, exit_code=outcome.returncode)
    result.report, result.cases = report, cases
    if result.status != OK:
        return result
    result.tail = outcome.tail
    if outcome.returncode in (70, 75) and report is not None and report.get("blame") in ("environment", "harness"):
        result.status = "error"  # no verdict (blame.py): the judge runs an environment's failure again
        result.reason = f"not the candidate's fault but the {report['blame']}'s: {report.get('reason')}"
    elif outcome.returncode not in (0, 1):
        result.status, result.reason = "error", f"pytest ended with status {outcome.returncode} (usage or internal error)"
    elif report is None:
        result.status, result.reason = "crashed", f"the {stage} stage ended without writing its JSON report"
    elif report.get("complete") is False:
        result.status = "timeout" if _timed_out(report) else "crashed"
        result.reason = f"the {stage} stage ended early, while running {report.get('running')}"
    else:
        result.status, result.reason = _verdict(stage, outcome.returncode, report, cases)
        if result.status == FAILED and _timed_out(report):   # its later items failed at once: the workdir ends here
            result.status = "timeout"
    return result


def _verdict(stage: str, returncode: int, report: dict, cases: list[dict]) -> tuple[str, str | None]:
    for kind in EXPECTED[stage]:
        mine = [c for c in cases if c["kind"] == kind]
        if not mine:
            return FAILED, f"no {kind} items were collected"
        if all(c["outcome"] == "skipped" for c in mine):
            return FAILED, f"every {kind} item was skipped"
    said = {f"{item.get('kind')} {str(item.get('test', '')).split('::')[-1]}": item.get("reason")
            for item in report.get("items", []) if isinstance(item, dict)}
    # `perf test_speedup (speedup 0.085x is below the required 1.05x)`: kind, name, the report's reason
    failed = [f"{c['kind']} {c['name']}" for c in cases if c["outcome"] in ("failure", "error")]
    failed = [name + (f" ({said[name]})" if said.get(name) else "") for name in failed]
    if failed:
        return FAILED, "failed: " + ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
    if returncode != 0 or not report.get("passed"):
        return FAILED, "the report does not say passed" if returncode == 0 else f"pytest exited {returncode}"
    return OK, None


def _timed_out(report: dict) -> bool:
    """Whether an item timed out (a correctness row, or an item's reason), though the session went on."""
    from pytest_cudaopt.run.watchdog import TIMEOUT_MARK

    return (any(r.get("data", {}).get("check") == "timeout" for r in report.get("results", []))
            or any(str(i.get("reason", "")).startswith(TIMEOUT_MARK) for i in report.get("items", [])
                   if isinstance(i, dict) and i.get("status") != "passed"))


def shortfall(result: StageResult) -> str | None:
    """The message of a check that failed only for want of device memory (every failure a SHORTFALL, or CUDA's
    out-of-memory error where the others were not run after it: loading the workdir), or None. A SHORTFALL the
    child blamed on the environment (others held the memory; it exits 75, the stage an `error`) counts too."""
    from pytest_cudaopt.results.records import SHORTFALL

    if result.stage != "check" or result.status not in (FAILED, "error") or not result.report:
        return None
    items = [i for i in result.report.get("items", []) if isinstance(i, dict) and i.get("status") == "failed"]
    if items and all("CUDA error: out of memory" in str(i.get("reason")) for i in items):
        return f"{items[0].get('test')}: {items[0].get('reason')}"
    if result.status != FAILED and result.report.get("blame") != "environment":
        return None
    failed = [r for r in result.report.get("results", []) if not r.get("passed")]
    memory = [r for r in failed if r.get("kind") == "correctness" and r.get("data", {}).get("check") == SHORTFALL]
    others = [c for c in result.cases if c["outcome"] in ("failure", "error") and c["kind"] != "correctness"]
    if not memory or len(memory) != len(failed) or others:
        return None
    return str(memory[0]["data"].get("message") or "the check ran out of device memory")
