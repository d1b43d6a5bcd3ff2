"""One correctness case: models (state as initialised or moved) and inputs built for it, the memory check, every guard; what a failed case reports."""

from __future__ import annotations

import functools
import gc
import traceback
from typing import Callable

import torch

from pytest_cudaopt.results import blame
from pytest_cudaopt.primitives import memory, nvml
from pytest_cudaopt.correctness import compare, family as family_case, guards, shapes, sizes, state, values
from pytest_cudaopt.correctness.faults import CudaFault
from pytest_cudaopt.correctness.precision import Precision
from pytest_cudaopt.results.records import SHORTFALL, CorrectnessResult
from pytest_cudaopt.primitives.tensors import clone_inputs, describe_inputs
from pytest_cudaopt.run.turn import pause_within
from pytest_cudaopt.run.watchdog import harness_step, set_case
from pytest_cudaopt.workdir import Workdir, WorkdirError


class Abort(BaseException):
    """A CUDA fault: not an Exception, so Hypothesis neither shrinks nor replays it."""

    def __init__(self, fault: CudaFault, case: str, replay: str = ""):
        super().__init__(str(fault))
        self.fault, self.case, self.replay = fault, case, replay


class CaseFailed(Exception):
    """A case that a guard or the comparison failed; `report` is the whole message."""

    def __init__(self, check: str, report: str, case: str = "", inputs: str = "",
                 comparison: compare.Comparison | None = None, precision: Precision | None = None):
        super().__init__(report)
        self.check, self.report, self.case, self.inputs = check, report, case, inputs
        self.comparison, self.precision = comparison, precision
        self.moved: tuple[dict[str, int], int] | None = None  # (constants, seed) of a case with moved state
        self.blame = blame.CANDIDATE  # whose failure it is (blame.py): a memory shortfall may be the environment's

    def diagnose(self, loaded: Workdir, settings) -> None:
        """A mismatch or wrong answer with moved state: say which tensors the candidate ignores."""
        if self.moved is None or self.check not in ("mismatch", "wrong"):
            return
        moved, self.moved = self.moved, None  # once, however often the failure is handed on
        try:
            found = state.diagnose(loaded, torch.device(settings.device), *moved, settings.atol, settings.rtol)
        except CudaFault as fault:
            raise Abort(fault, self.case) from None
        if found:
            self.report = f"{self.report}\n{found}"

    def fill(self, result: CorrectnessResult) -> None:
        """The failing case's inputs and errors, for the report's row."""
        result.shapes = self.inputs
        result.blame = self.blame
        if self.comparison is not None and self.comparison.leaves:
            result.max_abs, result.max_rel = self.comparison.max_abs, self.comparison.max_rel
        if self.precision is not None:
            result.precision = self.precision


def free_bytes(device: str, need: int = 0) -> int | None:
    """Free device memory (`memory.free_bytes`), None when there is no usable device."""
    try:
        return memory.free_bytes(device, need)
    except Exception:  # noqa: BLE001 - no usable device: nothing to plan (the item reports it)
        return None


def run_case(workdir: Workdir, settings, constants: dict[str, int], seed: int, label: str,
             replay: str = "", reference_decides: bool = False, moved: bool = False,
             family: str = values.MODEL) -> tuple[guards.CaseOutcome, list, list[str] | None]:
    """One case: models and inputs built with `constants` applied to model.py, then every guard; a skipped
    `family` is judged on model.py's values. Raises CaseFailed, Abort, or ReferenceError_ (`reference_decides`)."""
    args = (workdir, settings, constants, seed, label, replay, reference_decides, moved)
    try:
        try:
            return _run_case(*args, family)
        except values.FamilySkipped as exc:
            skipped = str(exc)
            let_go(exc)
        # model.py's own values are never skipped; run outside the handler, which would hold the skipped case
        outcome, inputs, names = _run_case(*args, values.MODEL)
        outcome.family, outcome.skipped = family, skipped
        return outcome, inputs, names
    except (CaseFailed, guards.ReferenceError_) as exc:
        let_go(exc)
        raise


def let_go(exc: BaseException) -> None:
    """Clear the locals of the finished frames that `exc`'s traceback, and its causes' and contexts', hold: a failed
    case's inputs, outputs and models are not held while the next case runs. Without it they wait for the cycle
    collector (the frame that raised CaseFailed holds it, its context holds that frame), or for Hypothesis to
    let go of the example."""
    pending, seen = [exc], set()
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        pending += [exc.__cause__, exc.__context__]


def _run_case(workdir: Workdir, settings, constants: dict[str, int], seed: int, label: str, replay: str,
              reference_decides: bool, moved: bool, family: str) -> tuple[guards.CaseOutcome, list, list[str] | None]:
    device = torch.device(settings.device)
    pause_within()   # a judge's check child: another workdir's turn on its device
    set_case(label, replay)
    planned = _check_memory(workdir, settings, constants, label, replay)
    with shapes.applied(workdir.reference, constants):
        try:
            model, model_new = workdir.make_models(device, seed=guards.derive_seed(seed, "weights"))
            with harness_step("moving Model's state from its defaults and loading it into ModelNew"):
                done = state.perturb_pair(workdir, model, model_new, seed) if moved else []
            with harness_step("drawing the inputs (model.py's get_inputs())"):
                inputs = workdir.inputs(seed, device)
        except WorkdirError as exc:
            if reference_decides and exc.file == workdir.model_file.name:
                raise guards.ReferenceError_(str(exc)) from exc
            raise CaseFailed("load", f"{exc}\ncase: {label}" + (f"\nreplay: {replay}" if replay else "")) from None
        names = guards.input_names(model.forward)
        applied = None
        if family != values.MODEL:
            inputs, applied = _family_inputs(model, inputs, family, guards.derive_seed(seed, "values", family), names)
        trial = guards.Trial(
            model=model, model_new=model_new, model64=None, workdir=workdir.path, device=device, atol=settings.atol,
            rtol=settings.rtol, max_rel_error=settings.max_rel_error, input_names=names,
            nondeterministic=workdir.nondeterministic or settings.nondeterministic,
            extra_allowed=frozenset(op.strip() for op in (settings.allow_ops or "").split(",") if op.strip()),
            judge_family=functools.partial(family_case.judge, applied) if applied else None,
            work_bytes=planned[2] if planned else 0)
        described = describe_inputs(inputs, names)
        footer = (f"\ncase: {label}; inputs {described}" + (f"\n{applied.describe()}" if applied else "")
                  + (f"\n{state.describe(done)}" if moved else "") + (f"\nreplay: {replay}" if replay else ""))
        short = shapes.format_case(constants) or "canonical"
        try:
            outcome = _guarded(trial, inputs, label, footer, short, described,
                               planned and functools.partial(holder, workdir, settings, *planned[:2]))
        except guards.GuardFailure as exc:
            failed = CaseFailed(exc.check, f"{exc.message}{footer}", short, described, exc.comparison, exc.precision)
            failed.moved = (dict(constants), seed) if done else None
            raise failed from None
        except CudaFault as exc:
            raise Abort(exc, f"{label}; inputs {described}", replay) from None
        except guards.CandidateError as exc:
            if applied is not None:  # values the reference rejects too: no case for this family
                _reference_accepts(model, inputs)
            if exc.file:  # model.py's inputs, refused before they reached ModelNew
                raise CaseFailed("load", f"{exc}{footer}", short, described) from None
            raise CaseFailed("candidate raised", f"{workdir.model_new_file.name}: {exc}{footer}",
                             short, described) from None
        except guards.ReferenceError_ as exc:
            if applied is not None:
                raise values.FamilySkipped(f"the reference rejects these values: {str(exc).splitlines()[-1]}") from None
            if reference_decides:
                raise
            raise CaseFailed("reference raised", f"{workdir.model_file.name}: {exc}{footer}",
                             short, described) from None
    outcome.family = family
    return outcome, inputs, names


def _family_inputs(model: torch.nn.Module, inputs: list, family: str, seed: int,
                   names: list[str] | None) -> tuple[list, values.Applied]:
    """The case's inputs with the family's values, and what changed, with the scale of the reference's
    output on model.py's values (to which the family's atol is proportioned)."""
    changed, applied = values.apply(family, inputs, seed, names)
    if family != "spikes":
        try:
            with torch.no_grad():
                applied.base_scale = values.output_scale(model(*clone_inputs(inputs)))
        except Exception:  # noqa: BLE001 - the guards run the reference and report what it raises
            applied.base_scale = 1.0
    return changed, applied


def _reference_accepts(model: torch.nn.Module, inputs: list) -> None:
    """Raise FamilySkipped when the reference raises on `inputs` as well."""
    try:
        with torch.no_grad():
            model(*clone_inputs(inputs))
    except Exception as exc:  # noqa: BLE001 - its message is the reason
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise values.FamilySkipped(f"the reference rejects these values: {type(exc).__name__}: {first}") from None


def _guarded(trial: guards.Trial, inputs: list, label: str, footer: str, short: str, described: str,
             holders: Callable[..., tuple[str, str]] | None) -> guards.CaseOutcome:
    """`guards.run_case`; torch's out-of-memory error fails the case as a memory shortfall, blamed
    as NVML's table says (`holders`, where the case's memory was planned), else on whose call it was."""
    try:
        return guards.run_case(trial, inputs)
    except (torch.OutOfMemoryError, guards.CandidateError, guards.ReferenceError_) as exc:
        error = exc if isinstance(exc, torch.OutOfMemoryError) else exc.__cause__
        if not isinstance(error, torch.OutOfMemoryError):
            raise
        lines = str(error).strip().splitlines()
        own = isinstance(exc, guards.CandidateError)  # else the reference's or the harness's own work
        del error  # its traceback holds the case's tensors
    why = lines[0] if lines else "torch.OutOfMemoryError"
    who, held = holders(own=own) if holders else (blame.CANDIDATE if own else blame.ENVIRONMENT, "")
    failed = CaseFailed(SHORTFALL, shortfall_text(who, held, f"{label} ran out of device memory: {why}") + footer,
                        short, described)
    failed.blame = who
    raise failed


def _check_memory(workdir: Workdir, settings, constants: dict[str, int], label: str,
                  replay: str) -> tuple[int, int, int] | None:
    """Fail the case at once when its inputs, outputs and the reference's intermediates cannot fit in free device
    memory (on the host, running past it is a kill, not an error); else (what it needs, what it may take, the
    intermediates), None where that cannot be planned."""
    check = shapes.check_on_meta(workdir.reference, constants)
    if not check.valid:
        return None
    need = memory.case_need(check.input_bytes, check.output_bytes, check.work_bytes)
    free = free_bytes(settings.device, need)
    if free is not None and need > free and torch.device(settings.device).type == "cpu":
        free = _host_room(workdir, settings.device)
    if free is None:
        return None
    lower = ("lower --cudaopt-max-elements (cudaopt_max_elements) to draw smaller shapes" if constants else
             sizes.shrink_hint(workdir.reference, workdir.model_file, workdir.path))
    budget = memory.case_budget(check.input_bytes, check.output_bytes)
    try:
        memory.check_fits(f"{label} ({memory.sizes(check.input_bytes, check.output_bytes, check.work_bytes)})",
                          need, free, lower, memory.where(settings.device))
    except memory.DoesNotFit as exc:
        who, why = holder(workdir, settings, need, budget)
        failed = CaseFailed(SHORTFALL, shortfall_text(who, why, str(exc)) + (f"\nreplay: {replay}" if replay else ""),
                            shapes.format_case(constants) or "canonical")
        failed.blame = who
        raise failed from None
    return need, budget, check.work_bytes


def _host_room(workdir: Workdir, device: str) -> int | None:
    """Free host memory once the last cases' tensors are let go: cycles through them collected here, and the worker
    asked for nothing (a ping), so that it drops the last reply it keeps until its next request."""
    gc.collect()
    worker = workdir.worker
    if worker is not None and worker.proc is not None:
        try:
            worker.ping()
        except Exception:  # noqa: BLE001 - a worker that does not answer holds what it holds; its case reports it
            pass
    return free_bytes(device)


def shortfall_text(who: str, why: str, text: str) -> str:
    """A memory shortfall's message: the candidate's opens with what its process holds, another's ends
    with the holders."""
    lines = [why, text] if who == blame.CANDIDATE else [text, why]
    return "\n".join(line for line in lines if line)


def allowance(workdir: Workdir, settings, budget: int = 0) -> tuple[int, str]:
    """The device memory the candidate's worker may hold at any case, and what it is: the workdir's largest case's
    budget (at least `budget`) and twice ModelNew's weights."""
    # The worker keeps what its largest case left in torch's cache: it may hold that much at any case.
    try:
        space = shapes.shape_space(workdir.reference, settings.max_elements)
    except Exception:  # noqa: BLE001 - no shape space: this case's budget alone
        space = None
    if space is not None and space.canonical_elements > 0:
        budget = max(budget, memory.largest_case_budget(space.canonical_bytes, space.canonical_elements,
                                                        space.max_elements))
    # ModelNew's parameters, and a copy it derives from them (packed, transposed), are the worker's too.
    weights = memory.weights_on_meta(workdir.reference)
    what = "the workdir's largest case with ModelNew's weights" if weights else "the workdir's largest case"
    return budget + 2 * weights, what


def holder(workdir: Workdir, settings, need: int, budget: int, own: bool = False) -> tuple[str, str]:
    """Whose a memory shortfall is, (blame, why), from NVML's process table."""
    device = torch.device(settings.device)
    worker = workdir.worker
    pid = worker.proc.pid if worker is not None and worker.proc is not None else None
    index = nvml.index_of(device.index or 0) if device.type == "cuda" else 0
    allowed, what = allowance(workdir, settings, budget)
    return blame.memory_blame(need, allowed, pid, nvml.processes(index), what, own=own)
