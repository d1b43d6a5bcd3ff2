"""pytest-xdist's distributions with one exception: a workdir's perf item runs on the worker that ran its canonical
correctness items, after them. The perf item holds ModelNew's timed outputs to the precision those items measured on
model.py's values (perf/timed_precision.py) and reports the workdir's tier over them; on another worker
it would see neither, and a candidate that computes less when only timed calls come would go unchecked."""

from __future__ import annotations

from pytest_cudaopt.results.ledger import kind_of


def unit_of(nodeid: str) -> str:
    """The work unit a node id goes to a worker in: a workdir's file for its perf and canonical correctness items,
    else the item alone (as `load` sends it)."""
    kind, name = kind_of(nodeid), nodeid.split("[")[0].rsplit("::", 1)[-1]
    if kind == "perf" or (kind == "correctness" and name == "test_canonical"):
        return "cudaopt-workdir:" + nodeid.split("::")[0]
    return nodeid


def perf_after_correctness(items: list) -> list:
    """`items` with each workdir's perf item that comes before its last correctness item moved just after it: the
    order within one process, as `scheduler`'s units are across pytest-xdist's workers."""
    def workdir(item, kind: str) -> str | None:
        return item.nodeid.split("::")[0] if kind_of(item.nodeid) == kind else None

    last = {file: n for n, item in enumerate(items) if (file := workdir(item, "correctness")) is not None}
    moved: dict[str, list] = {}
    ordered = []
    for n, item in enumerate(items):
        file = workdir(item, "perf")
        if file is not None and last.get(file, -1) > n:
            moved.setdefault(file, []).append(item)
            continue
        ordered.append(item)
        file = workdir(item, "correctness")
        if file is not None and last[file] == n:
            ordered.extend(moved.pop(file, []))
    return ordered


def scheduler(config, log):
    """The scheduler for the distributions that could part a workdir's perf item from its canonical items: `load`
    (pytest-xdist's default with `-n`), `worksteal` (its units as `load`'s, none stolen), `loadgroup` (an
    `xdist_group` mark's items together, as its own) and `loadscope` (a class's items together, as its own: the perf
    and correctness items are classes of their own); None for `loadfile` and `each`, which keep a file's items on one
    worker."""
    dist = config.getvalue("dist")
    if dist not in ("load", "worksteal", "loadgroup", "loadscope"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkdirScheduling(LoadScopeScheduling):
        """LoadScopeScheduling over `unit_of`'s units (in collection order within each), other items as `dist`
        sends them."""

        def _split_scope(self, nodeid: str) -> str:
            unit = unit_of(nodeid)
            if unit != nodeid:
                return unit
            if dist == "loadgroup" and nodeid.rfind("@") > nodeid.rfind("]"):   # as LoadGroupScheduling's
                return nodeid.split("@")[-1]
            return super()._split_scope(nodeid) if dist == "loadscope" else nodeid

        def remove_node(self, node):
            """As LoadScopeScheduling's, but the item a crashed worker was running is not sent again: requeued with
            its unit, a hang or a crash would end each replacement worker in turn (as `load`, it fails once)."""
            workload = self.assigned_work.pop(node)
            pending = [(scope, nodeid) for scope, unit in workload.items() for nodeid, done in unit.items() if not done]
            if not pending:
                return None
            scope, crashed = pending[0]
            workload[scope][crashed] = True
            self.workqueue.update((s, unit) for s, unit in workload.items() if not all(unit.values()))
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return WorkdirScheduling(config, log)
