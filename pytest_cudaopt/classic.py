"""The classic command lines `python -m utils.verification` / `utils.profiling`: their flags and output lines, over the plugin's verdicts."""

# Scripts and agents written for the published agent-workdir parse these lines:
#   [PASS] check 1/5 ... / [FAIL] check 2/5 ...    one line per correctness case
#   [PASS] verify success / [FAIL] verify failed ...
#   Torch Baseline: <t>us, Torch Compile: <t>us, CUDA Extension: <t>us
# The verdicts come from pytest (`pytest -m correctness|perf`); the lines are read back from its JSON report.

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

CONTENDERS = {"torch_baseline": "eager", "torch_compile": "compile", "cuda_extension": "custom"}
LABELS = {"eager": "Torch Baseline", "compile": "Torch Compile", "custom": "CUDA Extension"}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of runs, got {text!r}")
    return value


def _parser(command: str) -> argparse.ArgumentParser:
    from pytest_cudaopt.suite.settings import BY_NAME

    min_runs = BY_NAME["min_runs"]
    p = argparse.ArgumentParser(prog=f"python -m utils.{command}", add_help=True,
                                description="Classic flags; anything else goes to pytest "
                                            "(e.g. --cudaopt-profile=thorough).")
    # No default of its own: without --iters the setting decides (ini, environment, default).
    p.add_argument("--iters", type=_positive_int, default=None,
                   help=f"profiling: timed runs per contender at least ({min_runs.flag}; the engine keeps "
                        f"going until its medians are precise); verification: ignored. Default: "
                        f"{min_runs.ini_key} of the ini file or {min_runs.env_var}, else {min_runs.default}")
    p.add_argument("--single-run", default=None, metavar="NAMES",
                   help="comma-separated from torch_baseline,torch_compile,cuda_extension: run each once "
                        "on the canonical inputs, no timing and no guards (for ncu/nsys)")
    return p


def parse_contenders(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CONTENDERS]
    if bad or not names:
        raise ValueError(f"--single-run: unknown contender {', '.join(bad) or '(none)'}; "
                         f"choose from {','.join(CONTENDERS)}")
    return names


def verification_lines(doc: dict[str, Any]) -> list[str]:
    """`[PASS] check i/n: ...` per correctness case, then `[PASS] verify success` or `[FAIL] ...`."""
    cases = [r["data"] for r in doc.get("results", []) if r.get("kind") == "correctness"]
    lines = []
    for i, case in enumerate(cases, 1):
        tag = "PASS" if case.get("passed") else "FAIL"
        why = "" if case.get("passed") else f" ({case.get('check') or 'mismatch'})"
        what = " ".join(filter(None, (case.get("case"), case.get("inputs"))))
        lines.append(f"[{tag}] check {i}/{len(cases)}: {what}{why}")
    failed = sum(not c.get("passed") for c in cases)
    if not cases:
        lines.append("[FAIL] verify failed: no correctness case ran (see pytest's output above)")
    elif failed:
        lines.append(f"[FAIL] verify failed: {failed} of {len(cases)} checks failed")
    else:
        lines.append("[PASS] verify success")
    return lines


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.2f}us"


def profiling_lines(doc: dict[str, Any]) -> list[str]:
    """One `Torch Baseline: ..us, Torch Compile: ..us, CUDA Extension: ..us` line per perf result (medians)."""
    lines = []
    for rec in doc.get("results", []):
        if rec.get("kind") != "perf":
            continue
        medians = {c["key"]: c.get("median_s") for c in (rec["data"].get("timing") or {}).get("contenders", [])}
        lines.append(", ".join(f"{LABELS[k]}: {_us(medians.get(k))}" for k in ("eager", "compile", "custom")))
    return lines or ["Torch Baseline: n/a, Torch Compile: n/a, CUDA Extension: n/a (no perf result)"]


def _one_line(text: str) -> str:
    """A `user_traceback` text as one line: the error, then where in the workdir it was raised."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    frames = [ln.strip() for ln in lines if ln.startswith("  ")]
    return " ".join(ln.strip() for ln in lines if not ln.startswith("  ")) + (f" (at {frames[-1]})" if frames else "")


def _single_run_failed(message: str) -> int:
    print(f"single run: {message}", file=sys.stderr)
    return 1


def single_run(workdir: Path, names: Sequence[str]) -> int:
    """Run each named contender once on get_inputs() (seed 0), on CUDA when there is one. A build that fails,
    a CUDA build with no CUDA device, or a contender that raises is one line on stderr and exit code 1."""
    import torch

    from pytest_cudaopt import extension as build, workdir as wd
    from pytest_cudaopt.perf import lineup
    from pytest_cudaopt.suite.settings import SettingError

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        result = build.build(workdir)
    except SettingError as exc:
        return _single_run_failed(str(exc))
    except build.BuildError as exc:
        first = exc.diagnostics[0].splitlines()[0] if exc.diagnostics else ""  # the first compiler error
        return _single_run_failed(f"cuda_extension does not build: {first + '; ' if first else ''}{exc.summary}"
                                  + (" (`cudaopt build` prints the compiler's errors)" if first else ""))
    if result.cuda and device == "cpu" and "cuda_extension" in names:
        return _single_run_failed("no CUDA device is visible and cuda_extension is a CUDA build (kernels/*.cu): "
                                  "run --single-run cuda_extension on a machine with a GPU")
    try:
        work = wd.load_workdir(workdir, result.module)
        model, model_new = work.make_models(device)
        inputs = work.inputs(0, device)
    except wd.WorkdirError as exc:
        return _single_run_failed(_one_line(str(exc)))
    with torch.no_grad():
        for name in names:
            key = CONTENDERS[name]
            try:
                if key == "compile":
                    run, _ = lineup.compile_model(model, inputs, device)
                else:
                    run = model if key == "eager" else model_new
                run(*inputs)
                lineup.synchronize(device)
            except Exception as exc:  # noqa: BLE001 - the contender's own failure, in one line
                return _single_run_failed(f"{name} failed on {device}: " + _one_line(wd.user_traceback(exc, [workdir])))
            print(f"single run: {name} done on {device}")
    return 0


def exit_status(code: int, lines: Sequence[str]) -> int:
    """`code` (`cudaopt verify|profile`'s), but never 0 when the lines say a check failed (1) or nothing ran (5)."""
    if code != 0:
        return code
    if any(line.startswith("[FAIL]") for line in lines):
        return 5 if any("no correctness case ran" in line for line in lines) else 1
    if any("(no perf result)" in line for line in lines):
        return 5
    return 1 if any("CUDA Extension: n/a" in line for line in lines) else 0  # the custom path untimed


def main(command: str, workdir: Path, argv: Sequence[str]) -> int:
    """`command` is "verification" or "profiling"; returns the exit status (docs/results.md)."""
    parser = _parser(command)
    args, rest = parser.parse_known_args(list(argv))
    if args.single_run is not None:
        try:
            names = parse_contenders(args.single_run)
        except ValueError as exc:
            parser.error(str(exc))  # a usage error: status 2
        return single_run(workdir, names)
    from pytest_cudaopt.cli import main as cli_main

    extra = list(rest)
    if command == "profiling" and args.iters is not None:  # `--iters 20`, `--iters=20` alike
        extra.append(f"--cudaopt-min-runs={args.iters}")
    if command == "profiling" and not any(a.startswith("--cudaopt-far-slower") for a in extra):
        extra.append("--cudaopt-far-slower=0")   # its medians are what it prints: a slow kernel's too
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        code = cli_main(["verify" if command == "verification" else "profile", str(workdir),
                         f"--cudaopt-report={report}", *extra])
        doc = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    lines = verification_lines(doc) if command == "verification" else profiling_lines(doc)
    print("\n".join(lines))
    sys.stdout.flush()
    return exit_status(code, lines)
