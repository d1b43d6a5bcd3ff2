"""The correctness verdict's items: canonical inputs over secret seeds, then Hypothesis-drawn shapes, every case through the guards.

About 450 lines: the two judges (`judge_canonical`, `judge_drawn`) and the one case runner they
share, with the drawn shapes' bookkeeping (`_Stats`) and the memory check of a case."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

import pytest
import torch

from pytest_cudaopt import compare, faults, guards, memory, shapes
from pytest_cudaopt.workdir import Workdir, WorkdirError


class _Abort(BaseException):
    """A CUDA fault inside a Hypothesis run: not an Exception, so Hypothesis neither
    shrinks nor replays it (the CUDA context is gone)."""

    def __init__(self, fault: guards.CudaFault, case: str, replay: str = ""):
        super().__init__(str(fault))
        self.fault = fault
        self.case = case
        self.replay = replay


class CaseFailed(Exception):
    """A case that a guard or the comparison failed; `report` is the whole message."""

    def __init__(self, check: str, report: str, case: str = "", inputs: str = "",
                 comparison: compare.Comparison | None = None, precision: compare.Precision | None = None):
        super().__init__(report)
        self.precision = precision
        self.check = check
        self.report = report
        self.case = case
        self.inputs = inputs
        self.comparison = comparison

    def fill(self, result: compare.CorrectnessResult) -> None:
        """The failing case's inputs and errors, for the report's row."""
        result.shapes = self.inputs
        if self.comparison is not None and self.comparison.leaves:
            result.max_abs, result.max_rel = self.comparison.max_abs, self.comparison.max_rel
        if self.precision is not None:
            result.precision = self.precision


def _describe_inputs(inputs: list, names: list[str] | None) -> str:
    parts = []
    for i, x in enumerate(inputs):
        name = names[i] if names and i < len(names) else f"input{i}"
        if isinstance(x, torch.Tensor):
            dtype = str(x.dtype).removeprefix("torch.")
            parts.append(f"{name}: {dtype}[{', '.join(map(str, x.shape))}]")
        else:
            parts.append(f"{name}: {x!r}")
    return ", ".join(parts)


@dataclass
class _Stats:
    """What a drawn-shapes item has seen across its cases."""

    cases: int = 0
    rejected: int = 0
    last_rejection: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst: compare.Precision | None = None
    dims: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    dtypes: dict[int, str] = field(default_factory=dict)
    names: list[str] | None = None
    constants: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (min, max) judged

    def add_constants(self, constants: dict[str, int]) -> None:
        for name, value in constants.items():
            lo, hi = self.constants.get(name, (value, value))
            self.constants[name] = (min(lo, value), max(hi, value))

    def add(self, outcome: guards.CaseOutcome, inputs: list) -> None:
        self.cases += 1
        self.max_abs = max(self.max_abs, outcome.comparison.max_abs)
        self.max_rel = max(self.max_rel, outcome.comparison.max_rel)
        p = outcome.precision
        if self.worst is None or compare.worst_tier([self.worst.tier, p.tier]) != self.worst.tier \
                or (p.tier == self.worst.tier and p.candidate_error > self.worst.candidate_error):
            self.worst = p
        if p.vacuous and self.worst is not None:
            self.worst.vacuous = True
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                continue
            self.dtypes[i] = str(x.dtype).removeprefix("torch.")
            ranges = self.dims.setdefault(i, [(s, s) for s in x.shape])
            if len(ranges) == x.dim():
                self.dims[i] = [(min(lo, s), max(hi, s)) for (lo, hi), s in zip(ranges, x.shape)]

    def shapes(self) -> str:
        parts = []
        for i, ranges in self.dims.items():
            name = self.names[i] if self.names and i < len(self.names) else f"input{i}"
            dims = ", ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in ranges)
            parts.append(f"{name}: {self.dtypes[i]}[{dims}]")
        return ", ".join(parts)


@pytest.mark.correctness
class TestCorrectness:
    """`pytest -m correctness`: ModelNew computes Model's function, on the canonical inputs
    over `cudaopt_seeds` secret seeds (`seed_index`, parametrized by the plugin) and on
    Hypothesis-drawn shapes, through every guard. The judging is in `judge_canonical` and
    `judge_drawn`; the items only end the way they say."""

    @pytest.fixture
    def loaded(self, request, cudaopt_session, cudaopt_workdir_path) -> Workdir:
        """The workdir, loaded once per session; a build or load error fails the item."""
        from pytest_cudaopt import build

        if cudaopt_session.fault is not None:
            where, message = cudaopt_session.fault
            pytest.fail(f"not run: an earlier CUDA fault in {where} left this process's CUDA context "
                        f"unusable: {message}", pytrace=False)
        try:
            return cudaopt_session.workdir(cudaopt_workdir_path)
        except (build.BuildError, WorkdirError) as exc:
            failure = cudaopt_session.failure_report(cudaopt_workdir_path, request.node.nodeid, exc)
        pytest.fail(failure, pytrace=False)

    def test_canonical(self, request, loaded, cudaopt_session, cudaopt_settings, seed_index):
        """The canonical inputs of get_inputs(), with a fresh secret seed for each index."""
        failure = judge_canonical(loaded, cudaopt_settings, cudaopt_session, request.node.nodeid, seed_index)
        if failure:
            pytest.fail(failure, pytrace=False)

    def test_drawn_shapes(self, request, loaded, cudaopt_session, cudaopt_settings):
        """Shapes drawn by Hypothesis around the canonical one (or as model.py declares)."""
        verdict = judge_drawn(loaded, cudaopt_settings, cudaopt_session, request.node.nodeid)
        if verdict.skip:
            pytest.skip(verdict.skip)
        if verdict.failure:
            pytest.fail(verdict.failure, pytrace=False)


@dataclass
class Verdict:
    """How an item ends: fails with `failure`, is skipped with `skip`, or passes."""

    failure: str = ""
    skip: str = ""


def judge_canonical(loaded: Workdir, settings, session, nodeid: str, seed_index: int) -> str:
    """The canonical inputs of get_inputs() under the secret seed of `seed_index`, through
    every guard; the result is recorded. Returns why the item fails ("" when it passes)."""
    seed = guards.derive_seed(session.seed, "canonical", seed_index)
    replay = f"pytest {shlex.quote(nodeid)} --cudaopt-seed={session.seed}"
    result = compare.CorrectnessResult(workdir=str(loaded.path), test=nodeid,
                                       case=f"canonical seed{seed_index}", passed=False, seed=seed)
    started = _start(settings)
    failed: CaseFailed | None = None
    abort: _Abort | None = None
    try:
        outcome, inputs, names = _run(loaded, settings, session, {}, seed,
                                      label=f"canonical inputs of get_inputs(), seed {seed}", replay=replay)
    except CaseFailed as exc:
        failed = exc
    except _Abort as exc:
        abort = exc
    if abort is not None:
        return _fault(nodeid, session, result, started, abort)
    if failed is not None:
        failed.fill(result)
        _finish(session, result, started, failed.check, failed.report)
        return failed.report
    result.passed = True
    result.shapes = _describe_inputs(inputs, names)
    result.cases = 1
    result.max_abs, result.max_rel = outcome.comparison.max_abs, outcome.comparison.max_rel
    result.precision = outcome.precision
    _finish(session, result, started)
    return ""


def judge_drawn(loaded: Workdir, settings, session, nodeid: str) -> "Verdict":
    """Shapes past the canonical (explicit cases first), then drawn by Hypothesis from the
    session's seed (or as model.py declares), each through every guard; the result is
    recorded. Returns how the item ends."""
    import hypothesis

    try:
        space = shapes.shape_space(loaded.reference, settings.max_elements,
                                   _free_bytes(settings.device))
    except shapes.ShapeError as exc:
        space, failure = None, str(exc)
    if space is None:
        return Verdict(failure=failure)
    if space.strategy is None and settings.case is None:
        return Verdict(skip=f"no drawn shapes: {space.source}")
    result = compare.CorrectnessResult(workdir=str(loaded.path), test=nodeid, case="drawn shapes",
                                       passed=False)
    stats = _Stats()
    started = _start(settings)

    def replay(constants: dict[str, int]) -> str:
        return (f"pytest {shlex.quote(nodeid)} --cudaopt-seed={session.seed} "
                f"--cudaopt-case={shlex.quote(shapes.format_case(constants))}")

    explicit = shapes.explicit_cases(loaded.reference, space) if settings.case is None else shapes.Explicit()
    # A shape judged once keeps its outcome: Hypothesis maps several draws to one shape and
    # replays draws (shrinking, the final report), and must see the same result each time.
    # A failing shape runs again, so that a failure that does not repeat is called flaky.
    judged: dict[tuple, str] = {tuple(sorted(space.defaults.items())): "passed"}  # canonical: own items

    def one(constants: dict[str, int]) -> None:
        constants = {**{k: constants[k] for k in space.defaults if k in constants}, **constants}
        key = tuple(sorted({**space.defaults, **constants}.items()))
        before = judged.get(key) if settings.case is None else None
        if before == "passed":
            return
        if before == "rejected":
            hypothesis.reject()
        try:
            _one(constants)
        except hypothesis.errors.UnsatisfiedAssumption:
            judged[key] = "rejected"
            raise
        except BaseException:
            judged[key] = "failed"
            raise
        judged[key] = "passed"

    def _one(constants: dict[str, int]) -> None:
        if space.meta_usable:
            check = shapes.check_on_meta(loaded.reference, constants)
            if not check.valid:
                stats.rejected += 1
                stats.last_rejection = f"{shapes.format_case(constants)}: {check.reason}"
                hypothesis.reject()
            if not space.declared and space.max_elements and check.elements > space.max_elements:
                stats.rejected += 1
                stats.last_rejection = (f"{shapes.format_case(constants)}: {check.elements} input elements "
                                        f"> cudaopt_max_elements {space.max_elements}")
                hypothesis.reject()
        seed = guards.derive_seed(session.seed, "drawn", sorted(constants.items()))
        canonical = {k: v for k, v in space.defaults.items() if k in constants}
        label = (f"drawn shape {shapes.format_case(constants)} "
                 f"(canonical: {shapes.format_case(canonical)}), seed {seed}")
        try:
            outcome, inputs, names = _run(loaded, settings, session, constants, seed, label,
                                          replay=replay(constants),
                                          reference_decides=not space.meta_usable)
        except guards.ReferenceError_ as exc:
            stats.rejected += 1
            stats.last_rejection = f"{shapes.format_case(constants)}: {str(exc).splitlines()[-1]}"
            hypothesis.reject()
        stats.names = names
        stats.add(outcome, inputs)
        stats.add_constants(constants)

    failure, check, failed, abort = "", "", None, None
    try:
        if settings.case is not None:
            one(shapes.parse_case(settings.case))
        else:
            for constants in explicit.cases + explicit.combined:  # past the canonical and the smallest, first
                one(constants)

            @shapes.hypothesis_settings(settings.profile, settings.max_examples)
            @hypothesis.given(space.strategy)
            def drawn_shape(constants: dict[str, int]) -> None:
                one(constants)

            # Drawn from the session's secret seed: no workdir can know its shapes in advance.
            hypothesis.seed(session.seed)(drawn_shape)()
    except _Abort as exc:
        abort = exc
    except shapes.ShapeError as exc:
        failure, check = str(exc), "shape declaration"
    except hypothesis.errors.Unsatisfiable:
        if not stats.cases:  # with explicit cases run, too few shapes is reported below
            failure, check = (f"no drawn shape was valid ({stats.rejected} rejected; last: "
                              f"{stats.last_rejection}); the shapes were {space.source}. Declare the valid "
                              f"ones in model.py with {shapes.DECLARATION} (see the README)"), "no valid shape"
    except hypothesis.errors.UnsatisfiedAssumption:  # --cudaopt-case named an invalid shape
        failure, check = (f"--cudaopt-case={settings.case} is not a valid shape for model.py: "
                          f"{stats.last_rejection}"), "invalid --cudaopt-case"
    except BaseException as exc:  # noqa: BLE001 - unwrap what Hypothesis re-raises
        failed = _case_failed(exc)
        if failed is None:
            raise
        flaky = "" if failed is exc else ("\n(the failure did not happen again when the case was replayed: "
                                          "a race or other flaky behaviour)")
        failure, check = failed.report + flaky, failed.check
    if abort is not None:
        return Verdict(failure=_fault(nodeid, session, result, started, abort))
    if failure:
        result.cases = stats.cases
        if failed is not None:
            result.case = f"drawn shape {failed.case}"
            failed.fill(result)
        _finish(session, result, started, check, failure)
        return Verdict(failure=failure)
    notes = []
    if stats.constants:
        notes.append("constants " + ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in stats.constants.items()))
    if space.cap_note:
        notes.append(space.cap_note)
    if explicit.never_above:
        notes.append(f"no valid value above its default within cudaopt_max_elements {space.max_elements}: "
                     + ", ".join(explicit.never_above))
    if (settings.case is None and not space.declared and space.meta_usable
            and stats.cases < shapes.HANDFUL):
        few = (f"only {stats.cases} distinct valid shapes besides the canonical one could be found "
               f"({stats.rejected} rejected; last: {stats.last_rejection or '-'}); the shapes were "
               f"{space.source}. Declare the valid ones in model.py with {shapes.DECLARATION} "
               f"(see the README) so that more sizes are judged")
        result.cases, result.shapes = stats.cases, "; ".join([stats.shapes(), *notes])
        _finish(session, result, started, "few shapes", few)
        return Verdict(failure=few)
    result.passed = True
    result.case = f"drawn shapes ({stats.cases} cases)"
    result.cases = stats.cases
    result.shapes = "; ".join([stats.shapes(), *notes])
    result.max_abs, result.max_rel = stats.max_abs, stats.max_rel
    result.precision = stats.worst
    _finish(session, result, started)
    return Verdict()


def _case_failed(exc: BaseException) -> CaseFailed | None:
    if isinstance(exc, CaseFailed):
        return exc
    for inner in getattr(exc, "exceptions", ()):  # FlakyFailure, ExceptionGroup
        found = _case_failed(inner)
        if found is not None:
            return found
    return None


def _free_bytes(device: str) -> int | None:
    try:
        return memory.free_bytes(device)
    except Exception:  # noqa: BLE001 - no usable device: nothing to plan (the item reports it)
        return None


class _Started:
    """An item's start: its time, and the measurement of its peak device memory."""

    def __init__(self, settings):
        device = torch.device(settings.device)
        self.peak = None
        if device.type == "cuda" and torch.cuda.is_available():
            self.peak = memory.Peak(device).__enter__()
        self.time = time.perf_counter()

    def finish(self, with_peak: bool) -> tuple[float, int | None]:
        """(seconds since the start, the peak bytes or None)."""
        seconds = time.perf_counter() - self.time
        if self.peak is None:
            return seconds, None
        if not with_peak:  # after a CUDA fault no CUDA call is made
            memory.forget(self.peak)
            return seconds, None
        self.peak.__exit__(None, None, None)
        return seconds, self.peak.bytes


def _start(settings) -> _Started:
    return _Started(settings)


def _finish(session, result: compare.CorrectnessResult, started: _Started, check: str = "",
            message: str = "") -> None:
    result.seconds, peak = started.finish(with_peak=session.fault is None)
    if peak is not None:
        result.peak_bytes = peak
    if check:
        result.passed, result.check, result.message = False, check, message
    session.results.append(result)


def _fault(nodeid: str, session, result: compare.CorrectnessResult, started: _Started, exc: _Abort) -> str:
    """Record a CUDA fault (later GPU items report it) and return the item's message."""
    replay = f"\nreplay it alone under compute-sanitizer: compute-sanitizer {exc.replay}" if exc.replay else ""
    message = (f"CUDA fault on case {exc.case}:\n{exc.fault}\nThe CUDA context of this process is now "
               f"unusable: the remaining GPU tests of this session are not run and report this fault.{replay}")
    if session.fault is None:
        session.fault = (nodeid, faults.fault_line(str(exc.fault)))
    _finish(session, result, started, "CUDA fault", message)
    return message


def _extra_allowed(settings) -> frozenset[str]:
    return frozenset(op.strip() for op in (settings.allow_ops or "").split(",") if op.strip())


def _run(workdir: Workdir, settings, session, constants: dict[str, int], seed: int, label: str,
         replay: str = "", reference_decides: bool = False) -> tuple[guards.CaseOutcome, list, list[str] | None]:
    """One case: models and inputs built with `constants` applied to model.py, then every
    guard. Raises CaseFailed with the whole report, _Abort on a CUDA fault, and
    guards.ReferenceError_ when `reference_decides` and the reference rejects the case."""
    device = torch.device(settings.device)
    case_text = f"{label}; inputs "
    names: list[str] | None = None
    guards.set_case(label)
    _check_memory(workdir, settings, constants, label, replay)
    with shapes.applied(workdir.reference, constants):
        try:
            model, model_new = workdir.make_models(device, seed=guards.derive_seed(seed, "weights"))
            inputs = workdir.inputs(seed, device)
        except WorkdirError as exc:
            if reference_decides and exc.file == workdir.model_file.name:
                raise guards.ReferenceError_(str(exc)) from exc
            raise CaseFailed("load", f"{exc}\ncase: {label}" + (f"\nreplay: {replay}" if replay else "")) from None
        names = guards.input_names(model.forward)
        case_text += _describe_inputs(inputs, names)
        trial = guards.Trial(
            model=model, model_new=model_new, model64=guards.float64_copy(model), workdir=workdir.path,
            extension=workdir.extension, device=device, atol=settings.atol, rtol=settings.rtol,
            max_rel_error=settings.max_rel_error,
            nondeterministic=workdir.nondeterministic or settings.nondeterministic,
            extra_allowed=_extra_allowed(settings), history=_history(workdir), input_names=names)
        footer = f"\ncase: {case_text}" + (f"\nreplay: {replay}" if replay else "")
        short = shapes.format_case(constants) or "canonical"
        described = _describe_inputs(inputs, names)
        try:
            outcome = guards.run_case(trial, inputs)
        except guards.GuardFailure as exc:
            raise CaseFailed(exc.check, f"{exc.message}{footer}", short, described, exc.comparison,
                             exc.precision) from None
        except guards.CudaFault as exc:
            raise _Abort(exc, case_text, replay) from None
        except guards.CandidateError as exc:
            raise CaseFailed("candidate raised", f"{workdir.model_new_file.name}: {exc}{footer}",
                             short, described) from None
        except guards.ReferenceError_ as exc:
            if reference_decides:
                raise
            raise CaseFailed("reference raised", f"{workdir.model_file.name}: {exc}{footer}",
                             short, described) from None
    return outcome, inputs, names


def _check_memory(workdir: Workdir, settings, constants: dict[str, int], label: str, replay: str) -> None:
    """Fail the case at once, saying how much it needs and what is free, when its inputs
    and outputs (measured on the meta device) cannot fit in free device memory."""
    free = _free_bytes(settings.device)
    if free is None:
        return
    check = shapes.check_on_meta(workdir.reference, constants)
    if not check.valid:
        return
    lower = ("lower --cudaopt-max-elements (cudaopt_max_elements) to draw smaller shapes" if constants else
             f"the canonical sizes are {workdir.model_file.name}'s constants: free device memory or run on a "
             f"device with more")
    try:
        memory.check_fits(f"{label} (inputs {memory.gib(check.input_bytes)}, outputs "
                          f"{memory.gib(check.output_bytes)})",
                          memory.case_need(check.input_bytes, check.output_bytes), free, lower)
    except memory.DoesNotFit as exc:
        raise CaseFailed("memory", str(exc) + (f"\nreplay: {replay}" if replay else ""),
                         shapes.format_case(constants) or "canonical") from None


def _history(workdir: Workdir) -> guards.OutputHistory:
    history = getattr(workdir, "output_history", None)
    if history is None:
        history = guards.OutputHistory()
        workdir.output_history = history
    return history
