"""The memory plan of one correctness case over every KernelBench problem at its published size, on the meta device
(nothing allocated): how many problems a machine with this much free memory refuses before they run, with and
without the reference's intermediates, the problems whose intermediates are largest, and what counting them costs
a meta check.

    python benchmarks/host_memory_plan.py KERNELBENCH_DIR [--free-gib 22] [--top 8]

KERNELBENCH_DIR is a KernelBench checkout (the folder holding KernelBench/level1, or that folder itself); nothing of
it is copied here. --free-gib defaults to this host's free memory now.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
import warnings
from pathlib import Path

from pytest_cudaopt.correctness import shapes
from pytest_cudaopt.primitives import memory

GiB = memory.GiB


class _Uncounted:
    """memory.Intermediates' stand-in that counts nothing: the meta check as it was."""

    peak = 0

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _problems(root: Path):
    base = root / "KernelBench" if (root / "KernelBench").is_dir() else root
    for level in ("level1", "level2", "level3"):
        for n, path in enumerate(sorted((base / level).glob("*.py"))):
            spec = importlib.util.spec_from_file_location(f"kb_{level}_{n}", path)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception:  # noqa: BLE001 - a problem that does not import here is left out, and counted
                yield level, path.name, None
                continue
            yield level, path.name, module


def _timed(modules, counted: bool) -> float:
    saved = memory.Intermediates
    memory.Intermediates = saved if counted else _Uncounted
    try:
        started = time.perf_counter()
        for module in modules:
            shapes.run_on_meta(module, {})   # not check_on_meta: it keeps its answers
        return (time.perf_counter() - started) / max(len(modules), 1)
    finally:
        memory.Intermediates = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path)
    parser.add_argument("--free-gib", type=float, default=None)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    free = int(args.free_gib * GiB) if args.free_gib else memory.host_free_bytes()
    rows, skipped, modules = [], 0, {}
    for level, name, module in _problems(args.kernelbench):
        check = shapes.check_on_meta(module, {}) if module is not None else None
        if check is None or not check.valid:
            skipped += 1
            continue
        modules.setdefault(level, []).append(module)
        rows.append((level, name, check))
    print(f"free memory planned against: {free / GiB:.1f} GiB; {len(rows)} problems run on meta, {skipped} do not")
    print(f"{'level':8} {'problems':>8} {'with intermediates':>19} {'refused before':>15} {'refused now':>12}")
    for level in modules:
        mine = [c for lv, _, c in rows if lv == level]
        before = sum(memory.case_need(c.input_bytes, c.output_bytes) > free for c in mine)
        now = sum(memory.case_need(c.input_bytes, c.output_bytes, c.work_bytes) > free for c in mine)
        print(f"{level:8} {len(mine):8} {sum(c.work_bytes > 0 for c in mine):19} {before:15} {now:12}")
    for level, name, c in rows:
        if memory.case_need(c.input_bytes, c.output_bytes) <= free < memory.case_need(c.input_bytes, c.output_bytes,
                                                                                   c.work_bytes):
            print(f"refused now, not before: {level}/{name}: {memory.sizes(c.input_bytes, c.output_bytes, c.work_bytes)}")
    print("largest intermediates:")
    for level, name, c in sorted(rows, key=lambda r: -r[2].work_bytes)[:args.top]:
        print(f"  {level}/{name}: {memory.sizes(c.input_bytes, c.output_bytes, c.work_bytes)}")
    for level, found in modules.items():
        _timed(found, True)   # imports and first meta kernels, once
        without, counted = min(_timed(found, False) for _ in range(3)), min(_timed(found, True) for _ in range(3))
        print(f"meta check, {level}: {without * 1e3:.2f} ms a problem, {counted * 1e3:.2f} ms counting intermediates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
