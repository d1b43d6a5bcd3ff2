"""The trusted state of the process (a snapshot of every road) and its verification after candidate code ran."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pytest_cudaopt.isolation import dispatcher, flags, introspection, namespaces
from pytest_cudaopt.isolation.changes import ROADS, Change

# The flag whose value the caller sets itself around candidate calls (torch.no_grad()).
GRAD_MODE = "torch.is_grad_enabled()"
SHOWN = 12  # changes listed in a failure; the rest are counted


class Breach(BaseException):
    """Candidate code changed a road (the message is `failure`'s). Not an Exception, so that
    Hypothesis neither shrinks nor replays the case: the change is undone when found."""

    def __init__(self, message: str, case: str = ""):
        super().__init__(message)
        self.message = message
        self.case = case


@dataclass
class Snapshot:
    """Every road as it was at one moment; `unwatched` names what this torch cannot show."""

    attributes: dict[str, tuple[Any, dict[str, Any]]]
    imports: dict[str, Any]
    flags: dict[str, Any]
    registrations: dispatcher.Registrations | None
    unwatched: list[str] = field(default_factory=list)
    seconds: float = 0.0


def take(references: Sequence[Any] = ()) -> Snapshot:
    """The state of every road now; `references`: the workdirs' model.py modules loaded so far."""
    started = time.perf_counter()
    values, missing = flags.take()
    absent = dispatcher.missing_api()
    registrations = None if absent else dispatcher.take()
    unwatched = [f"flag {name} (not in this torch)" for name in missing]
    if absent:
        unwatched.append(f"the dispatcher (this torch lacks {', '.join(absent)})")
    elif not dispatcher.has_fallback_api():
        unwatched.append("backend fallbacks (this torch lacks torch._C._dispatch_has_backend_fallback)")
    snapshot = Snapshot(namespaces.take(references), namespaces.take_imports(), values, registrations, unwatched)
    snapshot.seconds = time.perf_counter() - started
    return snapshot


def changes(before: Snapshot, context: dict[str, Any] | None = None, full: bool = True) -> list[Change]:
    """What differs from `before`, every road; `context` gives the flags' expected values where
    the caller set them itself (e.g. {GRAD_MODE: False} inside torch.no_grad()). Without
    `full`, the kernels of every operator are not compared (the slow part: ~0.1 s); backend
    fallbacks and the Python dispatcher still are."""
    expected = {**before.flags, **(context or {})}
    found = namespaces.changes(before.attributes) + namespaces.import_changes(before.imports)
    found += flags.changes(expected)
    if before.registrations is not None:
        found += dispatcher.changes(before.registrations, kernels=full)
    return sorted(found, key=lambda c: (ROADS.index(c.road), c.what))


def failure(found: list[Change], phase: str, workdir: Path | None) -> str:
    """The message of an item that `found` fails: what changed, where the new thing came
    from, when it was seen."""
    lines = [f"candidate code changed what the reference and the baselines run ({phase}):"]
    lines += [f"  {change.line(workdir)}" for change in found[:SHOWN]]
    if len(found) > SHOWN:
        lines.append(f"  ... and {len(found) - SHOWN} more")
    lines.append("model_new.py and kernels/ may not change the Python attributes or functions of torch or of "
                 "model.py, torch's global flags or the operator dispatcher (an extension may define ops in a "
                 "namespace of its own, never register kernels for aten or another existing namespace); see "
                 "docs/isolation.md")
    return "\n".join(lines)


class Watch:
    """The session's trusted state and what was found against it. `trust()` takes a new
    trusted snapshot (only where no candidate code ran since the last verification);
    `verify()` compares, puts back what can be put back, and remembers a change that
    cannot (a dispatcher registration): the process is then `tainted` for later verdicts."""

    def __init__(self) -> None:
        self.trusted: Snapshot | None = None
        self.tainted: str = ""
        self.references: list[Any] = []   # the workdirs' model.py modules: watched as torch is
        introspection.reset()  # the hook is installed before any workdir code runs

    def trust(self, reference: Any = None) -> Snapshot:
        """A new trusted snapshot; `reference`: a workdir's model.py just imported (what it did
        at its import is the reference's own), watched from now on."""
        if reference is not None and not any(r is reference for r in self.references):
            self.references.append(reference)
        self.trusted = take(self.references)
        return self.trusted

    def trusted_grad_mode(self):
        """A block with autograd as trusted (a workdir loaded inside a perf item's no_grad()
        is verified against the trusted mode, and the caller's mode is back after it)."""
        import torch

        mode = self.trusted.flags.get(GRAD_MODE, True) if self.trusted is not None else torch.is_grad_enabled()
        return torch.set_grad_enabled(mode)

    def verify(self, phase: str, workdir: Path | None = None, context: dict[str, Any] | None = None,
               full: bool = True) -> str:
        """"" when every road is as trusted and candidate code read no frame; else the failure
        (see `failure`, `introspection.failure`)."""
        if self.tainted:
            return f"not judged: {self.tainted}"
        readings = introspection.take_readings()
        if readings:
            # What a frame reached (the harness's objects) cannot be verified or put back.
            self.tainted = (f"an earlier item found that candidate code in {workdir} read the interpreter's "
                            f"frames or object graph ({readings[0].line_text(workdir)}, {phase}), through which "
                            "it could change the harness's state; no later verdict of this process can trust it")
            return introspection.failure(readings, phase, workdir)
        if self.trusted is None:
            self.trust()
            return ""
        found = changes(self.trusted, context, full)
        if not found:
            return ""
        message = failure(found, phase, workdir)
        for change in found:
            if change.undo is not None:
                try:
                    change.undo()
                except Exception:  # noqa: BLE001 - what cannot be put back taints the process (below)
                    pass
        lasting = changes(self.trusted, context, full)
        if lasting:
            self.tainted = (f"an earlier item found that candidate code in {workdir} changed {lasting[0].road} "
                            f"{lasting[0].what} ({phase}), which cannot be put back; no later verdict of this "
                            "process can trust the reference or the baselines")
        return message
