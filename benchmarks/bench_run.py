"""The frame the default workdir's GPU benchmarks share: options, the built extension, a JSON-lines log."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pytest_cudaopt runs from the checkout, uninstalled
    sys.path.insert(0, str(ROOT))

Emit = Callable[[dict], None]


def main(argv: list[str] | None, *, doc: str | None, name: str, results: str, max_time: float,
         run: Callable[[Any, float, Emit], None], table: Callable[[list[dict]], str],
         failed: Callable[[list[dict]], bool] = lambda records: False, echo: bool = False) -> int:
    """Parse --out and --max-time, build the root workdir's extension, call run(ext, max_time, emit)
    with every record logged to OUT/`results` (and printed when `echo`), print table(records).
    Exit status: 2 without a CUDA device, 1 when failed(records), else 0."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench-out", help="results folder")
    parser.add_argument("--max-time", type=float, default=max_time, help="seconds of timed rounds per group")
    args = parser.parse_args(argv)
    import torch

    from pytest_cudaopt import extension as build

    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device visible", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    with open(out / results, "w") as log:
        def emit(record: dict) -> None:
            records.append(record)
            log.write(json.dumps(record, allow_nan=True) + "\n")
            log.flush()
            if echo:
                print(json.dumps(record), flush=True)

        run(build.build_extension(ROOT, verbose=True), args.max_time, emit)
    print(table(records))
    return 1 if failed(records) else 0
