"""Candidate code cannot reach the reference or the baselines: torch's namespaces, global flags and dispatcher, snapshotted before any workdir code runs and verified after.

What it offers: `Watch` (the session's trusted snapshot: `trust()`, `verify(phase, workdir)`
returning the failure text, `tainted` once a change cannot be put back), `take` / `changes`
(a snapshot and what differs from it, as `Change` rows naming the road, the attribute, flag or
`op / dispatch key`, and where the new thing was defined), `GRAD_MODE` (the flag callers set
themselves around candidate calls), `Breach` (raised where a change ends a case). Used by the
correctness and the speed verdicts alike.

The modules: namespaces.py (attributes of torch's modules and classes, sys.modules and the
import hooks), flags.py (torch's process-wide settings), dispatcher.py (kernels per dispatch
key, backend fallbacks, the Python dispatcher), changes.py (a change and where it came from),
watch.py (the snapshot, its comparison, the failure message), introspection.py (frame and
object-graph reads from model_new.py, seen by an audit hook). docs/isolation.md states the
guarantee."""

from pytest_cudaopt.isolation.changes import ROADS, Change
from pytest_cudaopt.isolation.watch import GRAD_MODE, Breach, Snapshot, Watch, changes, failure, take

__all__ = ["GRAD_MODE", "ROADS", "Breach", "Change", "Snapshot", "Watch", "changes", "failure", "take"]
