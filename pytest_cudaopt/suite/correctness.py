"""The correctness items: `pytest -m correctness`, judged by `pytest_cudaopt.correctness.verdict`."""

from __future__ import annotations

import pytest

import torch

from pytest_cudaopt.results import blame
from pytest_cudaopt.primitives import memory, nvml
from pytest_cudaopt.correctness.case import allowance, holder
from pytest_cudaopt.correctness.verdict import judge_canonical, judge_drawn
from pytest_cudaopt.results.ledger import SKIP_PROPERTY
from pytest_cudaopt.results.records import NOT_APPLICABLE, SHORTFALL
from pytest_cudaopt.workdir import Workdir

# Beyond twice what its largest case allows and this much more, a worker is taking device memory its cases do not
# need: on a shared GPU that is what its neighbours run short of, and what it took depends on what was free.
HOARD_SLACK = 8 << 30


@pytest.mark.correctness
class TestCorrectness:
    """ModelNew computes Model's function, on the canonical inputs and on Hypothesis-drawn shapes."""

    @pytest.fixture
    def loaded(self, request, cudaopt_session, cudaopt_workdir_path) -> Workdir:
        """The workdir, loaded once per session."""
        return cudaopt_session.loaded_or_fail(cudaopt_workdir_path, request.node.nodeid, "run")

    def test_canonical(self, request, loaded, cudaopt_session, cudaopt_settings, seed_index):
        """The canonical inputs of get_inputs(), with a fresh secret seed for each index."""
        failure = judge_canonical(loaded, cudaopt_settings, cudaopt_session, request.node.nodeid, seed_index)
        failure = _worker_memory(request.node, cudaopt_session, loaded, cudaopt_settings) or failure
        if failure:
            _fail(request.node, cudaopt_session, failure, loaded, cudaopt_settings)

    def test_drawn_shapes(self, request, loaded, cudaopt_session, cudaopt_settings):
        """Shapes drawn by Hypothesis around the canonical one (or as model.py declares)."""
        verdict = judge_drawn(loaded, cudaopt_settings, cudaopt_session, request.node.nodeid)
        hoard = _worker_memory(request.node, cudaopt_session, loaded, cudaopt_settings)
        if hoard:
            _fail(request.node, cudaopt_session, hoard, loaded, cudaopt_settings)
        if verdict.skip:  # model.py has nothing to vary: no verdict is missing
            request.node.user_properties.append((SKIP_PROPERTY, NOT_APPLICABLE))
            pytest.skip(verdict.skip)
        if verdict.failure:
            _fail(request.node, cudaopt_session, verdict.failure, loaded, cudaopt_settings)


def held_bytes(loaded: Workdir, settings) -> int | None:
    """The device memory the candidate's worker holds now (NVML); None on the CPU or with no worker."""
    worker = loaded.worker
    if worker is None or worker.proc is None or settings.device == "cpu":
        return None
    return nvml.used_by(worker.proc.pid, nvml.index_of(torch.device(settings.device).index or 0))


def _worker_memory(item: pytest.Item, session, loaded: Workdir, settings) -> str | None:
    """The device memory the candidate's worker holds now, in the item's results; the item's failure (a memory
    verdict, the candidate's) when that is more than twice what the workdir's largest case allows and HOARD_SLACK
    more, whether or not a case ran short (alone it would: beside other checks, others do)."""
    held = held_bytes(loaded, settings)
    mine = [r for r in session.results
            if getattr(r, "test", None) == item.nodeid and getattr(r, "kind", "") == "correctness"]
    for result in mine:
        result.worker_bytes = held
    if held is None or not mine or not mine[-1].passed:
        return None
    allowed, what = allowance(loaded, settings)
    if held <= 2 * allowed + HOARD_SLACK:
        return None
    text = (f"ModelNew's process (pid {loaded.worker.proc.pid}) holds {memory.gib(held)}; {what} allows "
            f"{memory.gib(allowed)}: it took device memory its cases do not need")
    mine[-1].passed, mine[-1].check, mine[-1].message, mine[-1].blame = False, SHORTFALL, text, blame.CANDIDATE
    session.note_hog(loaded.path, item.nodeid, text)
    return text


def _fail(item: pytest.Item, session, failure: str, loaded: Workdir, settings) -> None:
    """Fail the item with `failure`, blamed as its result says. A memory shortfall of the candidate's whose worker
    holds more than the workdir's largest case allows: the worker is stopped (`note_hog`)."""
    mine = [r for r in session.results if getattr(r, "test", None) == item.nodeid and getattr(r, "blame", None)]
    if mine:
        blame.assign(item, mine[-1].blame)
        if mine[-1].blame == blame.CANDIDATE and getattr(mine[-1], "check", "") == SHORTFALL:
            who, why = holder(loaded, settings, 0, 0)
            if who == blame.CANDIDATE and why:
                session.note_hog(loaded.path, item.nodeid, why)
    pytest.fail(failure, pytrace=False)
