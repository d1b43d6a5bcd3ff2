"""The build item: the workdir's extension compiles, links and imports (in the workdir's worker), wherever pytest runs (a CPU-only CI too)."""

from __future__ import annotations

import pytest

from pytest_cudaopt.extension import BuildError
from pytest_cudaopt.run.watchdog import set_stage
from pytest_cudaopt.workdir import WorkdirError


@pytest.mark.build
class TestBuild:
    """`pytest -m build`: the kernels compile (once per session; the other items reuse the module)."""

    def test_extension(self, request, cudaopt_session, cudaopt_workdir_path) -> None:
        set_stage("building the extension")
        try:
            cudaopt_session.extension(cudaopt_workdir_path)
            set_stage("importing the extension in the workdir's worker")
            cudaopt_session.workdir(cudaopt_workdir_path)
        except WorkdirError:
            return  # the extension imported; model.py or model_new.py did not: the correctness items say so
        except BuildError as exc:
            failure = cudaopt_session.failure_report(cudaopt_workdir_path, request.node.nodeid, exc)
        else:
            return
        pytest.fail(failure, pytrace=False)  # outside the except block: one report, no exception chain
