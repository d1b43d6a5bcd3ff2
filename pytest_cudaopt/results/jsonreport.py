"""The JSON report (`--cudaopt-report`): schema cudaopt-report/2 (docs/results.md), written whole or not at all, read back by `cudaopt report` (version 1 files too)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from pytest_cudaopt.results import report
from pytest_cudaopt.primitives.environment import environment

SCHEMA = "cudaopt-report/2"
SCHEMA_V1 = "cudaopt-report/1"  # no items, no `complete` unless false, `passed` over the results alone
READABLE = (SCHEMA_V1, SCHEMA)


def document(account: Any, results: Sequence[Any], *, seed: int | None = None,
             settings: Mapping[str, Any] | None = None, relaxations: Sequence[str] = (),
             sandbox: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report: the run's facts and settings, its account (`ledger.Account`) and records."""
    return {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "environment": environment(),
            "seed": seed, "settings": dict(settings or {}), "relaxations": list(relaxations),
            "sandbox": dict(sandbox) if sandbox else {"mode": (settings or {}).get("sandbox"), "workers": 0},
            "passed": account.passed, "complete": account.complete, "cause": account.cause, "blame": account.blame,
            "reason": account.reason or None, "running": account.running, "not_passed": list(account.not_passed),
            "counts": dict(account.counts), "items": [item.to_json() for item in account.items],
            "results": [report.record(r) for r in results]}


def write_json(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write `doc` to `path` aside, then rename it over: a kill mid-write leaves the previous one whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(report.strict_dumps(doc, indent=2) + "\n")
    os.replace(partial, path)
    return path


def unusable(path: str | Path, others: Mapping[str, str | Path | None] = {}) -> tuple[str, bool]:
    """Why the report cannot go to `path` ("" when it can), and whether that refuses the run."""
    path = Path(path).resolve()
    for option, other in others.items():
        if other and Path(other).resolve() == path:
            return f"{path} is also the file of {option}; one would overwrite the other", True
    if path.is_dir():
        return f"{path} is a folder", True
    if path.exists():
        try:
            read(path)
        except ValueError:
            return f"{path} exists and is not a cudaopt JSON report; it is left alone", True
    return cannot_write(path), False


def cannot_write(path: Path) -> str:
    """Why no file can be made at `path` ("" when one can): its folder made if need be, a probe file beside it
    written and removed (the file itself untouched)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        return f"{path} cannot be written ({type(exc).__name__}: {exc.strerror or exc})"
    return ""


def read(path: str | Path) -> dict[str, Any]:
    """A JSON report read back; ValueError for anything else, or a version this one cannot read."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a cudaopt JSON report ({exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if isinstance(schema, str) and schema.startswith("cudaopt-report/") and schema not in READABLE:
        raise ValueError(f"{path}: schema {schema!r} is newer than this cudaopt reads ({', '.join(READABLE)}); "
                         "upgrade pytest-cudaopt to read it")
    if schema not in READABLE:
        raise ValueError(f"{path}: not a cudaopt JSON report (schema {schema!r}, expected {SCHEMA!r})")
    return doc


def verdict_lines(doc: Mapping[str, Any]) -> list[str]:
    """The report's `passed` and `complete`, and why, as the terminal summary prints them."""
    if doc.get("schema") == SCHEMA_V1:
        complete = doc.get("complete", True)
        return [f"cudaopt: {'passed' if doc.get('passed') and complete else 'NOT PASSED'} (schema 1: `passed` "
                "counts only the results listed; skipped, not run and policy items were not recorded)"]
    account = SimpleNamespace(passed=bool(doc.get("passed")), complete=bool(doc.get("complete")),
                              reason=doc.get("reason") or "", counts=doc.get("counts") or {},
                              not_passed=doc.get("not_passed") or [], blame=doc.get("blame"))
    return report.account_lines(account)


def render_file(path: str | Path, fmt: str = "table") -> str:
    """Render a `--cudaopt-report` JSON file as tables (`cudaopt report`) or Markdown."""
    path = Path(path)
    doc = read(path)
    env = doc.get("environment") or {}
    gpu = f"{env.get('gpu')} ({env.get('gpu_capability')})" if env.get("gpu") else "no GPU"
    seeds = doc.get("seeds")  # a judge line's report: a seed per stage
    seed = (f"seed {doc.get('seed')}" if not isinstance(seeds, dict) or not seeds else
            "seeds " + ", ".join(f"{stage} {value}" for stage, value in seeds.items()))
    head = (f"cudaopt report {path.name}: {doc.get('created', '?')}, {gpu}, torch {env.get('torch')}, "
            f"CUDA {env.get('cuda')}, {seed}")
    body = report.render_records(doc.get("results", []), fmt)
    lines = verdict_lines(doc)
    if fmt == "markdown":
        head = f"_{head}_"
        lines = [f"**{lines[0]}**", *(f"- {line.strip()}" for line in lines[1:])]
    return "\n\n".join([head, body or "(no results)", "\n".join(lines)])
