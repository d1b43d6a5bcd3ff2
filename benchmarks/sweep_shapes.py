"""Sweep KernelBench's level 1-3 problems through the correctness verdict's shape loop on CPU
(meta device: no memory, no compute) and report how many get every inferred constant judged
above its default.

    python benchmarks/sweep_shapes.py KERNELBENCH_DIR [--before] [--examples 25] [--seed 0]

KERNELBENCH_DIR is a KernelBench checkout (the folder holding KernelBench/level1, or that
folder itself). --before measures the older strategy: derandomised draws only, no explicit
cases. Prints one line per problem whose constants do not all go above, then a summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import time
import warnings
from pathlib import Path

import hypothesis
from hypothesis import strategies as st

from pytest_cudaopt import shapes


class SweepTimeout(KeyboardInterrupt):
    """A problem's meta-device runs took longer than --limit seconds (a KeyboardInterrupt,
    the one kind of exception Hypothesis neither catches nor shrinks)."""


def _alarm(signum, frame):
    raise SweepTimeout()


def problems(root: Path) -> list[Path]:
    base = root / "KernelBench" if (root / "KernelBench").is_dir() else root
    found = []
    for level in ("level1", "level2", "level3"):
        found += sorted((base / level).glob("*.py"))
    if not found:
        raise SystemExit(f"{root}: no KernelBench/level1-3/*.py files")
    return found


def load(path: Path):
    name = f"kb_{path.parent.name}_{path.stem}".replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def judged(module, space, examples: int, seed: int, before: bool) -> tuple[list[dict], list[str]]:
    """The valid cases the draw loop would judge (explicit ones first unless `before`)."""
    cases: list[dict] = []
    never: list[str] = []
    seen = {tuple(sorted(space.defaults.items()))}

    def valid(case: dict) -> bool:
        check = shapes.check_on_meta(module, case)
        return check.valid and (not space.max_elements or check.elements <= space.max_elements)

    if not before:
        explicit = shapes.explicit_cases(module, space)
        never = explicit.never_above
        for case in explicit.cases:
            seen.add(tuple(sorted(case.items())))
            cases.append(case)
    options = dict(shapes.PROFILES["ci"], max_examples=examples)
    if before:
        options["derandomize"] = True

    @hypothesis.settings(suppress_health_check=shapes.SUPPRESSED, **options)
    @hypothesis.given(space.strategy)
    def draw(case: dict) -> None:
        key = tuple(sorted(case.items()))
        if not before and key in seen:
            hypothesis.reject()
        seen.add(key)
        if not valid(case):
            hypothesis.reject()
        cases.append(case)

    try:
        (draw if before else hypothesis.seed(seed)(draw))()
    except hypothesis.errors.Unsatisfiable:
        pass
    return cases, never


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path)
    parser.add_argument("--before", action="store_true", help="the older strategy: derandomised, no explicit cases")
    parser.add_argument("--examples", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=20, help="seconds per problem before it is left out")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    total = all_above = varied = capped = 0
    timed_out: list[str] = []
    signal.signal(signal.SIGALRM, _alarm)
    for path in problems(args.kernelbench):
        label = f"{path.parent.name}/{path.name}"
        try:
            module = load(path)
            space = shapes.shape_space(module)
        except Exception as exc:  # noqa: BLE001 - a problem file that does not load here
            print(f"skip {label}: {type(exc).__name__}: {exc}"[:200])
            continue
        if space.strategy is None or not space.meta_usable:
            continue
        signal.alarm(args.limit)
        try:
            cases, never = judged(module, space, args.examples, args.seed, args.before)
        except SweepTimeout:
            timed_out.append(label)
            continue
        finally:
            signal.alarm(0)
        total += 1
        above = {name for name, default in space.defaults.items() if any(c.get(name, 0) > default for c in cases)}
        if above == set(space.defaults):
            all_above += 1
        else:
            missing = sorted(set(space.defaults) - above)
            print(f"{label}: never above its default: {', '.join(missing)}"
                  + (f" (no valid value above within the cap: {', '.join(never)})" if never else ""))
        if never:
            capped += 1
        if above:
            varied += 1
    seconds = time.perf_counter() - started
    strategy = "before (derandomised draws)" if args.before else "after (explicit cases + seeded draws)"
    print(f"\nstrategy: {strategy}; {args.examples} draws; {seconds:.0f} s")
    print(f"problems with inferred constants: {total}")
    print(f"every constant judged above its default: {all_above} of {total} ({100 * all_above / max(total, 1):.0f}%)")
    print(f"no constant ever above its default: {total - varied}")
    print(f"with a constant that has no valid value above its default within the cap: {capped}")
    if timed_out:
        print(f"left out (over {args.limit} s on the meta device): {len(timed_out)}: {', '.join(timed_out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
