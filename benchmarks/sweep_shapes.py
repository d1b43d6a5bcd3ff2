"""Sweep KernelBench's level 1-3 problems through the correctness verdict's shape loop on CPU
(meta device: no memory, no compute) and report how many get every inferred constant judged
above its default.

    python benchmarks/sweep_shapes.py KERNELBENCH_DIR [--before] [--examples 25] [--seed 0]
    python benchmarks/sweep_shapes.py KERNELBENCH_DIR --derived

KERNELBENCH_DIR is a KernelBench checkout (the folder holding KernelBench/level1, or that
folder itself). --before measures the older strategy: derandomised draws only, no explicit
cases. Prints one line per problem whose constants do not all go above, then a summary.
--derived counts instead the problems with a constant that model.py writes in terms of other
constants (`bias_shape = (out_features,)`) and that was drawn apart from them: before (every
int constant drawn on its own) and after (derived constants follow the drawn ones).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import hypothesis
from hypothesis import strategies as st

from pytest_cudaopt.correctness import derived, shapes


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
    options = {"derandomize": True} if before else {}

    @hypothesis.settings(shapes.hypothesis_settings("ci", examples), **options)
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


def drawn_apart(module) -> dict:
    """The constants model.py derives from others, and those of them drawn on their own before
    (every int constant drawn) and after (derived ones recomputed from the drawn values)."""
    written = {item.name: item.text for item in derived.candidates(module)}

    def drawn(follow: bool) -> list[str]:
        names = {key.partition("[")[0] for key in shapes.infer_constants(module, follow_derived=follow)}
        return sorted(names & set(written))

    return {"derived": written, "before": drawn(False), "after": drawn(True)}


def _one(path: Path, args) -> dict:
    try:
        module = load(path)
        if args.derived:
            return drawn_apart(module)
        space = shapes.shape_space(module)
    except Exception as exc:  # noqa: BLE001 - a problem file that does not load here
        return {"skip": f"{type(exc).__name__}: {exc}"}
    if space.strategy is None or not space.meta_usable:
        return {"defaults": {}}
    cases, never = judged(module, space, args.examples, args.seed, args.before)
    above = [name for name, default in space.defaults.items() if any(c.get(name, 0) > default for c in cases)]
    return {"defaults": space.defaults, "above": above, "never": never}


def _in_child(path: Path, args) -> dict | None:
    """_one(path) in a forked child, killed after --limit seconds (None then): a problem
    whose meta-device run is slow cannot stall the sweep."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            data = json.dumps(_one(path, args)).encode()
        except BaseException as exc:  # noqa: BLE001
            data = json.dumps({"skip": f"{type(exc).__name__}: {exc}"}).encode()
        with os.fdopen(write, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + args.limit
    chunks = []
    with os.fdopen(read, "rb") as inp:
        os.set_blocking(inp.fileno(), False)
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            try:
                chunk = inp.read()
            except BlockingIOError:
                chunk = None
            if chunk:
                chunks.append(chunk)
            if done:
                rest = inp.read()
                if rest:
                    chunks.append(rest)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            time.sleep(0.02)
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return None


def derived_main(args) -> int:
    """--derived: the problems that drew a derived constant apart from its constants."""
    started = time.perf_counter()
    with_derived = before = after = 0
    left_out: list[str] = []
    for path in problems(args.kernelbench)[::args.every]:
        label = f"{path.parent.name}/{path.name}"
        outcome = _in_child(path, args)
        if outcome is None or "skip" in outcome:
            left_out.append(label)
            continue
        with_derived += bool(outcome["derived"])
        before += bool(outcome["before"])
        after += bool(outcome["after"])
        if outcome["before"]:
            written = ", ".join(f"{k} = {outcome['derived'][k]}" for k in outcome["before"])
            still = f"; still drawn apart: {', '.join(outcome['after'])}" if outcome["after"] else ""
            print(f"{label}: drawn apart before: {written}{still}")
    print(f"\n{time.perf_counter() - started:.0f} s")
    print(f"problems with a constant written in terms of others: {with_derived}")
    print(f"with one drawn apart from them: before {before}, after {after}")
    if left_out:
        print(f"left out (did not load, or over {args.limit} s): {len(left_out)}: {', '.join(left_out)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path)
    parser.add_argument("--before", action="store_true", help="the older strategy: derandomised, no explicit cases")
    parser.add_argument("--examples", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=20, help="seconds per problem before it is left out")
    parser.add_argument("--every", type=int, default=1, help="a deterministic sample: every Nth problem")
    parser.add_argument("--derived", action="store_true",
                        help="count the problems that drew a derived constant apart, before and after")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)  # no thread pool to inherit across fork (a forked child could hang on it)
    if args.derived:
        return derived_main(args)
    started = time.perf_counter()
    total = all_above = varied = capped = 0
    timed_out: list[str] = []
    for path in problems(args.kernelbench)[::args.every]:
        label = f"{path.parent.name}/{path.name}"
        outcome = _in_child(path, args)
        if outcome is None:
            timed_out.append(label)
            continue
        if "skip" in outcome:
            print(f"skip {label}: {outcome['skip']}"[:200])
            continue
        if not outcome["defaults"]:
            continue
        total += 1
        defaults, above, never = outcome["defaults"], set(outcome["above"]), outcome["never"]
        if above == set(defaults):
            all_above += 1
        else:
            missing = [name for name in defaults if name not in above]
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
