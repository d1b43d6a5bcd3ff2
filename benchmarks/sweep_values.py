"""Draw every value family on every KernelBench level-1 and level-2 problem, on the CPU, and count
the families judged, skipped (with their reasons) and the harness errors.

    python benchmarks/sweep_values.py KERNELBENCH_DIR [--levels level1 level2] [--max-elements 4194304]

KERNELBENCH_DIR is a KernelBench checkout; nothing of it is copied here. Each problem runs in a
forked child with a time limit (sweep_init.in_child). Its inferred constants are halved, the
largest first, until its inputs hold at most --max-elements elements (the published sizes take
up to 17 GB; the families do not depend on the size). Then, per family: the inputs of
get_inputs() under a fixed seed with the family's values, the float32 and float64 reference on
them, and the family's judging (correctness/family.py) of the float32 reference's own output as
the candidate's. A problem whose model.py does not load here is counted apart (not judged).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_init  # noqa: E402  (in_child, problems)


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"kb_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _small(module, limit: int) -> dict[str, int]:
    """Constants halved, the largest first, until the inputs hold at most `limit` elements;
    constants of one value that are valid only together (a batch that must equal a width) are
    halved together."""
    from pytest_cudaopt.correctness import shapes

    constants = shapes.infer_constants(module)
    case: dict[str, int] = {}
    check = shapes.check_on_meta(module, case)
    while check.valid and check.elements > limit:
        now = {k: case.get(k, v) for k, v in constants.items()}
        steps = [{name: now[name] // 2} for name in sorted(now, key=lambda k: -now[k]) if now[name] >= 2]
        steps += [{k: v // 2 for k, v in now.items() if v == value} for value in sorted(set(now.values()), reverse=True)
                  if value >= 2 and list(now.values()).count(value) > 1]
        for step in steps:
            trial_check = shapes.check_on_meta(module, {**case, **step})
            if trial_check.valid:
                case, check = {**case, **step}, trial_check
                break
        else:
            break
    if check.elements > 64 * limit:  # could not shrink: the published sizes would not fit here
        raise MemoryError(f"inputs of {check.elements} elements could not be shrunk below {limit}")
    return case


def judge(path: Path, limit: int = 1 << 22) -> dict:
    """Every family on one problem: {family: "judged" | "skipped: why" | "error: why"}."""
    import torch

    from pytest_cudaopt.correctness import family as family_case, guards, shapes, values
    from pytest_cudaopt.primitives.tensors import clone_nest
    from pytest_cudaopt.workdir import private_rng

    try:
        module = _load(path)
        case = _small(module, limit)
    except Exception as exc:  # noqa: BLE001 - model.py itself does not load here
        return {"reference": f"{type(exc).__name__}: {exc}"[:300]}
    outcome: dict = {"case": shapes.format_case(case)}
    with shapes.applied(module, case), torch.no_grad():
        try:
            with private_rng(1):
                model = module.Model(*module.get_init_inputs()).eval()
                base = list(module.get_inputs())
        except Exception as exc:  # noqa: BLE001
            return {"reference": f"{type(exc).__name__}: {exc}"[:300]}
        names = guards.input_names(model.forward)
        for family in values.ALL:
            try:
                inputs, applied = values.apply(family, base, 7, names)
                try:
                    expected = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
                except Exception as exc:  # noqa: BLE001 - the reference rejects these values
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    raise values.FamilySkipped(f"the reference rejects these values: {type(exc).__name__}: {first}")
                if family != values.MODEL and family != "spikes":
                    applied.base_scale = values.output_scale(model(*base))
                trial = guards.Trial(model=model, model_new=None, model64=None, workdir=path.parent,
                                     device=torch.device("cpu"), atol=1e-2, rtol=1e-2, input_names=names)
                candidate = clone_nest(expected)
                comparison, precision = family_case.judge(applied, trial, inputs, candidate, expected)
                outcome[family] = f"judged: {precision.tier}"
            except values.FamilySkipped as exc:
                outcome[family] = f"skipped: {exc}"
            except guards.GuardFailure as exc:
                outcome[family] = f"error: the reference's own output fails: {exc.message.splitlines()[0]}"[:300]
            except Exception as exc:  # noqa: BLE001 - a harness error
                outcome[family] = f"error: {type(exc).__name__}: {exc}"[:300]
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernelbench", type=Path, help="a KernelBench checkout")
    parser.add_argument("--levels", nargs="+", default=["level1", "level2"])
    parser.add_argument("--max-elements", type=int, default=1 << 22)
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per problem")
    args = parser.parse_args(argv)
    paths = [p for p in sweep_init.problems(args.kernelbench) if p.parent.name in args.levels]
    warnings.simplefilter("ignore")
    import torch

    from pytest_cudaopt.correctness import family, values  # noqa: F401  (imported before the children fork)

    torch.set_num_threads(1)
    started = time.perf_counter()
    outcomes = {f"{p.parent.name}/{p.name}": sweep_init.in_child(p, args.limit, lambda q: judge(q, args.max_elements))
                for p in paths}
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter = collections.Counter()
    errors = []
    for label, outcome in outcomes.items():
        level = label.split("/")[0]
        if "reference" in outcome or "lines" in outcome:
            counts[level]["model.py does not load or run here"] += 1
            errors.append(f"not judged: {label}: {outcome.get('reference') or outcome.get('lines')}")
            continue
        for name in values.ALL:
            state = outcome.get(name, "error: no result")
            counts[level][f"{name} {state.split(':')[0]}"] += 1
            if state.startswith("skipped"):
                reasons[f"{name}: {state.split(': ', 1)[1].split(' at ')[0][:90]}"] += 1
                errors.append(f"skipped: {label} ({outcome.get('case')}): {name}: {state}")
            if state.startswith("error"):
                errors.append(f"{label} ({outcome.get('case')}): {name}: {state}")
    for level, counter in sorted(counts.items()):
        print(f"{level}: " + ", ".join(f"{k} {v}" for k, v in sorted(counter.items())))
    for reason, n in reasons.most_common():
        print(f"  skipped {n}x: {reason}")
    for line in errors:
        print(line[:400])
    print(f"{len(outcomes)} problems in {time.perf_counter() - started:.0f} s")
    return 1 if any(line.startswith(("level", "not judged")) for line in errors) else 0


if __name__ == "__main__":
    sys.exit(main())
