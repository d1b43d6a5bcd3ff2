"""The correctness verdict: the canonical inputs over secret seeds, then shapes past them and drawn by Hypothesis, every case through the guards."""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from pytest_cudaopt.primitives import memory
from pytest_cudaopt.correctness import guards, shapes, values
from pytest_cudaopt.correctness.compare import Comparison
from pytest_cudaopt.correctness.case import Abort, CaseFailed, free_bytes, holder, run_case, shortfall_text
from pytest_cudaopt.correctness.faults import WorkerCrash, fault_line
from pytest_cudaopt.correctness.precision import EXACT, UNKNOWN, WRONG, Precision, combined, pool_sets
from pytest_cudaopt.results.records import SHORTFALL, CorrectnessResult
from pytest_cudaopt.suite.settings import replay_args
from pytest_cudaopt.primitives.tensors import describe_inputs
from pytest_cudaopt.run.watchdog import harness_seconds
from pytest_cudaopt.workdir import Workdir


@dataclass
class Verdict:
    """How an item ends: fails with `failure`, is skipped with `skip`, or passes."""

    failure: str = ""
    skip: str = ""


@contextlib.contextmanager
def recorded(result: CorrectnessResult, settings, session) -> Iterator[CorrectnessResult]:
    """Time the item and its peak device memory into `result`, appended to `session.results` on a normal end."""
    device = torch.device(settings.device)
    measured = device.type == "cuda" and torch.cuda.is_available()
    started = time.perf_counter()
    with memory.Peak(device) if measured else contextlib.nullcontext() as peak:
        try:
            yield result
        finally:
            if peak is not None and session.fault is not None:
                peak.abandon()
    result.seconds = time.perf_counter() - started
    result.harness_seconds = min(harness_seconds(), result.seconds)
    if peak is not None and peak.bytes is not None:
        result.peak_bytes = peak.bytes
    session.results.append(result)


def _replay(nodeid: str, session, settings, case: str = "") -> str:
    """The command that replays an item (`case`: its --cudaopt-case option, if any)."""
    return f"pytest {shlex.quote(nodeid)} --cudaopt-seed={session.seed}{case}{replay_args(settings)}"


def _fail(result: CorrectnessResult, check: str, message: str) -> str:
    result.passed, result.check, result.message = False, check, message
    return message


def _fault(nodeid: str, session, result: CorrectnessResult, exc: Abort) -> str:
    """Mark a CUDA fault (later GPU items report it) and return the item's message. A crash of
    the worker is the candidate's alone: the next item gets a fresh worker."""
    if isinstance(exc.fault, WorkerCrash):
        replay = f"\nreplay: {exc.replay}" if exc.replay else ""
        words = f"\nits last output:\n{exc.fault.words}" if exc.fault.words else ""
        case = re.search(r"--cudaopt-case=\S+", exc.replay or "")  # in the first line: the item's reason
        where = f"case: {exc.case}" + (f"; {case.group(0)}" if case else "")
        return _fail(result, "crash", f"CRASH: {exc.fault} ({where}){replay}{words}")
    replay = f"\nreplay it alone under compute-sanitizer: compute-sanitizer {exc.replay}" if exc.replay else ""
    message = (f"CUDA fault on case {exc.case}:\n{exc.fault}\nThe CUDA context of this process is now "
               f"unusable: the remaining GPU tests of this session are not run and report this fault.{replay}")
    if session.fault is None:
        session.fault = (nodeid, fault_line(str(exc.fault)))
    return _fail(result, "CUDA fault", message)


def judge_canonical(loaded: Workdir, settings, session, nodeid: str, seed_index: int) -> str:
    """The canonical inputs under the secret seed of `seed_index`, recorded; why the item fails, or ""."""
    seed = guards.derive_seed(session.seed, "canonical", seed_index)
    replay = _replay(nodeid, session, settings)
    family = values.canonical_family(seed_index, values.parse(settings.values))
    case = f"canonical seed{seed_index}" + (f" (values {family})" if family != values.MODEL else "")
    result = CorrectnessResult(workdir=str(loaded.path), test=nodeid, case=case, passed=False, seed=seed,
                               state="moved" if seed_index else "default")
    with recorded(result, settings, session):
        try:
            try:
                outcome, inputs, names = run_case(
                    loaded, settings, {}, seed, replay=replay, moved=seed_index > 0, family=family,
                    label=f"canonical inputs of get_inputs(), seed {seed}, values {family}")
                shapes_seen = describe_inputs(inputs, names)
                del inputs   # not held while the further sets run: each case's memory budget is its own
                extra = _more_sets(loaded, settings, seed, replay, seed_index, outcome)
            except CaseFailed as exc:
                exc.diagnose(loaded, settings)  # may raise Abort
                raise
        except Abort as exc:
            return _fault(nodeid, session, result, exc)
        except CaseFailed as exc:
            exc.fill(result)
            return _fail(result, exc.check, exc.report)
        result.passed, result.cases = True, 1 + len(extra)
        result.shapes = shapes_seen
        first = outcome.comparison   # every set's outputs as one comparison's (its NaN rules)
        every = Comparison(True, first.atol, first.rtol, [leaf for o in [outcome, *extra] for leaf in
                                                          o.comparison.leaves])
        result.max_abs, result.max_rel = every.max_abs, every.max_rel
        result.precision = combined([outcome.precision] + [o.precision for o in extra])
        seen: dict[str, values.Seen] = {}
        values.record(seen, outcome.family, result.precision,
                      f"the canonical inputs{values.worst_element(outcome.comparison)}", outcome.skipped)
        seen[outcome.family].cases += len(extra)   # model.py's values, pooled
        result.values = {name: entry.to_json() for name, entry in seen.items()}
        if outcome.skipped:
            result.case = f"canonical seed{seed_index} (values {family} skipped: model.py's)"
    return ""


def _more_sets(loaded: Workdir, settings, seed: int, replay: str, seed_index: int,
               first: guards.CaseOutcome) -> list[guards.CaseOutcome]:
    """Where the canonical case ran on model.py's values and its outputs are small, the further input sets that make
    its precision a steady figure (precision.pool_sets): the perf items hold timed outputs to it. Each is a case of
    its own, through every guard; an exact, unknown or wrong precision needs none."""
    if first.family != values.MODEL or first.skipped or first.precision.tier in (EXACT, UNKNOWN, WRONG):
        return []
    count = pool_sets(sum(leaf.total for leaf in first.comparison.leaves if not leaf.exact))
    found = []
    for k in range(1, count):
        extra = guards.derive_seed(seed, "pool", k)
        found.append(run_case(loaded, settings, {}, extra, replay=replay, moved=seed_index > 0,
                              label=f"canonical inputs of get_inputs(), seed {extra} (input set {k + 1} of "
                                    f"{count}: one small output's error is a draw, not a figure)")[0])
    return found


@dataclass
class _Stats:
    """What a drawn-shapes item has seen across its cases."""

    cases: int = 0
    rejected: int = 0
    last_rejection: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: Precision | None = None
    dims: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    dtypes: dict[int, str] = field(default_factory=dict)
    names: list[str] | None = None
    constants: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (min, max) judged
    seen: dict[str, values.Seen] = field(default_factory=dict)  # value family -> what it met
    shapes_judged: set[tuple] = field(default_factory=set)       # distinct shapes (whatever their values)

    def reject(self, case: str, why: str) -> None:
        import hypothesis

        self.rejected += 1
        self.last_rejection = f"{case}: {why}"
        hypothesis.reject()

    def add(self, outcome: guards.CaseOutcome, inputs: list, constants: dict[str, int]) -> None:
        self.cases += 1
        self.shapes_judged.add(tuple(sorted(constants.items())))
        where = f"drawn shape {shapes.format_case(constants)}{values.worst_element(outcome.comparison)}"
        values.record(self.seen, outcome.family, outcome.precision, where, outcome.skipped)
        self.max_abs = max(self.max_abs, outcome.comparison.max_abs)
        self.max_rel = max(self.max_rel, outcome.comparison.max_rel)
        if outcome.precision.worse_than(self.worst):  # an unknown one too, where none came before
            self.worst = outcome.precision
        if outcome.precision.vacuous:
            self.worst.vacuous = True
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                continue
            self.dtypes[i] = str(x.dtype).removeprefix("torch.")
            ranges = self.dims.setdefault(i, [(s, s) for s in x.shape])
            if len(ranges) == x.dim():
                self.dims[i] = [(min(lo, s), max(hi, s)) for (lo, hi), s in zip(ranges, x.shape)]
        for name, value in constants.items():
            lo, hi = self.constants.get(name, (value, value))
            self.constants[name] = (min(lo, value), max(hi, value))

    def shapes(self) -> str:
        parts = []
        for i, ranges in self.dims.items():
            name = self.names[i] if self.names and i < len(self.names) else f"input{i}"
            dims = ", ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in ranges)
            parts.append(f"{name}: {self.dtypes[i]}[{dims}]")
        return ", ".join(parts)


class _DrawnShapes:
    """One drawn-shapes item: the explicit cases, then the shapes Hypothesis draws (or one `--cudaopt-case`).
    A shape judged keeps its outcome (Hypothesis replays draws); a failing one runs again, to tell a flaky failure."""

    def __init__(self, loaded: Workdir, settings, session, nodeid: str, space: shapes.ShapeSpace):
        self.loaded, self.settings, self.session, self.nodeid, self.space = loaded, settings, session, nodeid, space
        self.stats = _Stats()
        self.explicit = (shapes.explicit_cases(loaded.reference, space) if settings.case is None else shapes.Explicit())
        self.judged: dict[tuple, str] = {}
        # A shape passed on one value family is not judged again on another; the canonical
        # shape is judged by its own items.
        self.passed_shapes: set[tuple] = {tuple(sorted(space.defaults.items()))}

    def replay(self, constants: dict[str, int], family: str = values.MODEL) -> str:
        case = shapes.format_case(constants) + (f",values={family}" if family != values.MODEL else "")
        return _replay(self.nodeid, self.session, self.settings, f" --cudaopt-case={shlex.quote(case.lstrip(','))}")

    def judge(self, constants: dict[str, int], family: str = values.MODEL) -> None:
        """One shape and value family, at most once (see the class); raises what `_judge` raises."""
        import hypothesis

        constants = {**{k: constants[k] for k in self.space.defaults if k in constants}, **constants}
        shape = tuple(sorted({**self.space.defaults, **constants}.items()))
        key = (*shape, ("values", family))
        before = self.judged.get(key) if self.settings.case is None else None
        if before == "passed" or (self.settings.case is None and shape in self.passed_shapes):
            return
        if before == "rejected":
            hypothesis.reject()
        try:
            self._judge(constants, family)
        except hypothesis.errors.UnsatisfiedAssumption:
            self.judged[key] = "rejected"
            raise
        except BaseException:
            self.judged[key] = "failed"
            raise
        self.judged[key] = "passed"
        self.passed_shapes.add(shape)

    def _judge(self, constants: dict[str, int], family: str) -> None:
        space, stats, case = self.space, self.stats, shapes.format_case(constants)
        if space.meta_usable:
            check = shapes.check_on_meta(self.loaded.reference, constants)
            if not check.valid:
                stats.reject(case, check.reason)
            if not space.declared and space.max_elements and check.elements > space.max_elements:
                stats.reject(case, f"{check.elements} input elements > cudaopt_max_elements {space.max_elements}")
        seed = guards.derive_seed(self.session.seed, "drawn", sorted(constants.items()))
        canonical = {k: v for k, v in space.defaults.items() if k in constants}
        label = f"drawn shape {case} (canonical: {shapes.format_case(canonical)}), seed {seed}, values {family}"
        try:
            outcome, inputs, names = run_case(self.loaded, self.settings, constants, seed, label,
                                              replay=self.replay(constants, family),
                                              reference_decides=not space.meta_usable, moved=True, family=family)
        except guards.ReferenceError_ as exc:
            stats.reject(case, str(exc).splitlines()[-1])
        stats.names = names
        stats.add(outcome, inputs, constants)

    def run(self) -> tuple[str, str, CaseFailed | None]:
        """Judge every case; (failure, check, the failed case) or ("", "", None)."""
        import hypothesis

        settings, space, stats = self.settings, self.space, self.stats
        try:
            if settings.case is not None:
                case, family = values.split_case(settings.case)
                self.judge(shapes.parse_case(case), family)
                return "", "", None
            for constants in self.explicit.cases + self.explicit.combined:  # past the canonical and the smallest
                self.judge(constants)

            @shapes.hypothesis_settings(settings.profile, settings.max_examples)
            @hypothesis.given(space.strategy, values.strategy(values.parse(settings.values)))
            def drawn_shape(constants: dict[str, int], family: str) -> None:
                self.judge(constants, family)

            # Drawn from the session's secret seed: no workdir can know its shapes in advance.
            hypothesis.seed(self.session.seed)(drawn_shape)()
        except shapes.ShapeError as exc:
            return str(exc), "shape declaration", None
        except ValueError as exc:  # --cudaopt-case named no value family
            if settings.case is None:
                raise
            return str(exc), "invalid --cudaopt-case", None
        except hypothesis.errors.Unsatisfiable:
            if not stats.cases:  # with explicit cases run, too few shapes is reported by few_shapes()
                return (f"no drawn shape was valid ({stats.rejected} rejected; last: {stats.last_rejection}); "
                        f"the shapes were {space.source}; {shapes.OWNER_DECLARES}"), "no valid shape", None
        except hypothesis.errors.UnsatisfiedAssumption:  # --cudaopt-case named an invalid shape
            return (f"--cudaopt-case={settings.case} is not a valid shape for model.py: "
                    f"{stats.last_rejection}"), "invalid --cudaopt-case", None
        except Abort:
            raise
        except CaseFailed as exc:
            exc.diagnose(self.loaded, self.settings)
            raise
        except BaseException as exc:  # noqa: BLE001 - unwrap what Hypothesis re-raises
            failed = _case_failed(exc)
            if failed is None:
                raise
            failed.diagnose(self.loaded, self.settings)
            return failed.report + _unrepeated(failed, exc), failed.check, failed
        return "", "", None

    def notes(self) -> list[str]:
        notes = [self.stats.shapes()]
        if self.stats.constants:
            notes.append("constants " + ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in self.stats.constants.items()))
        notes += [note for note in (self.space.derived_note(), self.space.cap_note) if note]
        if self.explicit.never_above:
            notes.append(f"no valid value above its default within cudaopt_max_elements {self.space.max_elements}: "
                         + ", ".join(self.explicit.never_above))
        return notes

    def few_shapes(self) -> str:
        """Why too few shapes were judged, or "". No case at all always fails: it proves nothing."""
        space, stats = self.space, self.stats
        if not stats.cases:
            why = (f"{stats.rejected} rejected; last: {stats.last_rejection}" if stats.rejected else
                   f"every shape drawn was the canonical one, which the canonical items judge; declare others "
                   f"with {shapes.DECLARATION}, or {shapes.DECLARATION} = {{}} for none")
            meta = f"; the reference does not run on the meta device: {space.meta_note}" if space.meta_note else ""
            return f"no drawn shape could be judged ({why}); the shapes were {space.source}{meta}"
        canonical = tuple(sorted(space.defaults.items()))  # judged with a value family: not another shape
        judged = {tuple(sorted({**space.defaults, **dict(k)}.items())) for k in stats.shapes_judged}
        distinct = len(judged - {canonical})
        if self.settings.case is not None or space.declared or not space.meta_usable or distinct >= shapes.HANDFUL:
            return ""
        return (f"only {distinct} distinct valid shapes besides the canonical one could be found "
                f"({stats.rejected} rejected; last: {stats.last_rejection or '-'}); the shapes were "
                f"{space.source}; so that more sizes are judged, {shapes.OWNER_DECLARES}")


def _unrepeated(failed: CaseFailed, raised: BaseException) -> str:
    """The note for a failure that Hypothesis did not see again when it replayed the case ("" when it did)."""
    if failed is raised:
        return ""
    if failed.check == SHORTFALL:
        return ("\n(the case found the device memory it needs when it was replayed: free memory depends on what "
                "else runs on the device)")
    return "\n(the failure did not happen again when the case was replayed: a race or other flaky behaviour)"


def _case_failed(exc: BaseException) -> CaseFailed | None:
    if isinstance(exc, CaseFailed):
        return exc
    found = (_case_failed(inner) for inner in getattr(exc, "exceptions", ()))  # FlakyFailure, ExceptionGroup
    return next((f for f in found if f is not None), None)


def judge_drawn(loaded: Workdir, settings, session, nodeid: str) -> Verdict:
    """Shapes past the canonical (explicit cases first), then drawn by Hypothesis, recorded; how the item ends."""
    try:
        space = shapes.shape_space(loaded.reference, settings.max_elements, free_bytes(settings.device))
    except shapes.ShapeError as exc:
        return Verdict(failure=str(exc))
    if space.strategy is None and settings.case is None:
        return Verdict(skip=f"no drawn shapes: {space.source}")
    drawn = _DrawnShapes(loaded, settings, session, nodeid, space)
    result = CorrectnessResult(workdir=str(loaded.path), test=nodeid, case="drawn shapes", passed=False, state="moved")
    with recorded(result, settings, session):
        try:
            failure, check, failed = drawn.run()
        except Abort as exc:
            return Verdict(failure=_fault(nodeid, session, result, exc))
        except CaseFailed as exc:  # raised outside Hypothesis: an explicit case or --cudaopt-case
            failure, check, failed = exc.report, exc.check, exc
        result.cases = drawn.stats.cases
        if failure:
            if failed is not None:
                result.case = f"drawn shape {failed.case}"
                failed.fill(result)
            return Verdict(failure=_fail(result, check, failure))
        result.shapes = "; ".join(drawn.notes())
        result.values = {name: entry.to_json() for name, entry in drawn.stats.seen.items()}
        few = drawn.few_shapes()
        if few and space.cap_note:  # free memory capped the shapes: whose is it?
            size = space.canonical_bytes
            result.blame, why = holder(loaded, settings, memory.case_need(size, 0), memory.case_budget(size, 0))
            text = shortfall_text(result.blame, why, f"{few}; {space.cap_note}")
            return Verdict(failure=_fail(result, SHORTFALL, text))
        if few:
            return Verdict(failure=_fail(result, "few shapes" if drawn.stats.cases else "no case judged", few))
        grown = values.grown(drawn.stats.seen)
        if grown:
            result.precision = drawn.stats.worst
            return Verdict(failure=_fail(result, "values", f"{grown}\nreplay: {_replay(nodeid, session, settings)}"))
        result.passed = True
        result.case = f"drawn shapes ({drawn.stats.cases} cases)"
        result.max_abs, result.max_rel = drawn.stats.max_abs, drawn.stats.max_rel
        result.precision = drawn.stats.worst
    return Verdict()
