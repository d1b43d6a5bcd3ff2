"""The correctness items: `pytest -m correctness`, judged by `pytest_cudaopt.correctness.verdict`."""

from __future__ import annotations

import pytest

import torch

from pytest_cudaopt.results import blame
from pytest_cudaopt.primitives import nvml
from pytest_cudaopt.correctness.case import holder
from pytest_cudaopt.correctness.verdict import judge_canonical, judge_drawn
from pytest_cudaopt.results.ledger import SKIP_PROPERTY
from pytest_cudaopt.results.records import NOT_APPLICABLE, SHORTFALL
from pytest_cudaopt.workdir import Workdir


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
        _worker_memory(request.node, cudaopt_session, loaded, cudaopt_settings)
        if failure:
            _fail(request.node, cudaopt_session, failure, loaded, cudaopt_settings)

    def test_drawn_shapes(self, request, loaded, cudaopt_session, cudaopt_settings):
        """Shapes drawn by Hypothesis around the canonical one (or as model.py declares)."""
        verdict = judge_drawn(loaded, cudaopt_settings, cudaopt_session, request.node.nodeid)
        _worker_memory(request.node, cudaopt_session, loaded, cudaopt_settings)
        if verdict.skip:  # model.py has nothing to vary: no verdict is missing
            request.node.user_properties.append((SKIP_PROPERTY, NOT_APPLICABLE))
            pytest.skip(verdict.skip)
        if verdict.failure:
            _fail(request.node, cudaopt_session, verdict.failure, loaded, cudaopt_settings)


def _worker_memory(item: pytest.Item, session, loaded: Workdir, settings) -> None:
    """The device memory the candidate's worker holds now (NVML), in the item's results."""
    worker = loaded.worker
    if worker is None or worker.proc is None or settings.device == "cpu":
        return
    device = torch.device(settings.device)
    held = nvml.used_by(worker.proc.pid, nvml.index_of(device.index or 0))
    for result in session.results:
        if getattr(result, "test", None) == item.nodeid and getattr(result, "kind", "") == "correctness":
            result.worker_bytes = held


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
