"""The memory-safety item: `pytest -m memsafety`, judged by `pytest_cudaopt.memsafety.verdict`."""

from __future__ import annotations

import pytest

from pytest_cudaopt.correctness.case import holder
from pytest_cudaopt.correctness.guards import derive_seed
from pytest_cudaopt.memsafety.verdict import (REQUIRED, begin, conclude, failure_text, find_sanitizer, key_of,
                                               sanitizes)
from pytest_cudaopt.primitives.memory import OVERHEAD
from pytest_cudaopt.results import blame
from pytest_cudaopt.results.ledger import SKIP_PROPERTY
from pytest_cudaopt.results.records import NOT_APPLICABLE
from pytest_cudaopt.run.turn import pause_within


@pytest.mark.memsafety
class TestMemorySafety:
    """One small case of ModelNew in a child process under compute-sanitizer."""

    def test_memory_safety(self, request, cudaopt_session, cudaopt_settings, cudaopt_workdir_path):
        # The plugin's own tests run the plumbing on the CPU with a stand-in sanitizer they name.
        if not sanitizes(cudaopt_settings):  # no CUDA kernel to check: not a missing verdict
            request.node.user_properties.append((SKIP_PROPERTY, NOT_APPLICABLE))
            pytest.skip("cudaopt_device is cpu: the memory-safety item checks CUDA kernels with compute-sanitizer")
        sanitizer, where = find_sanitizer(cudaopt_settings.compute_sanitizer)
        if sanitizer is None:
            reason = (f"compute-sanitizer not found (looked in {where}); it comes with the CUDA toolkit, or "
                      "set cudaopt_compute_sanitizer")
            if cudaopt_settings.ci_gate:  # the gate never passes without a verdict it asked for
                from pytest_cudaopt.commands.gate import SETUP_PROPERTY

                request.node.user_properties.append((SETUP_PROPERTY, reason))
                pytest.fail(f"{reason}: the CI gate never passes without the memory-safety verdict", pytrace=False)
            pytest.skip(reason)
        workdir = cudaopt_session.loaded_or_fail(cudaopt_workdir_path, request.node.nodeid, "run")
        workers = cudaopt_session.workers
        try:
            begun = workers.begun_for(cudaopt_workdir_path)   # sent as the workdir loaded
            if begun is None or begun[0].key != key_of(workdir, cudaopt_settings, sanitizer):
                if begun is not None:   # another build since: afresh
                    begun[0].sanitized.close()
                begun = workers.keep_begun(cudaopt_workdir_path, begin(
                    workdir, cudaopt_settings, derive_seed(cudaopt_session.seed, "memsafety"), sanitizer,
                    ahead=workers.take_sanitized(cudaopt_workdir_path)))
            # a judge's check child pauses while it waits on them (their time limit grows by the pause)
            result = conclude(begun[0], workdir.path, request.node.nodeid, paused=begun[1], between=pause_within)
        finally:
            workers.end_begun(cudaopt_workdir_path)
        cudaopt_session.results.append(result)
        if not result.passed and not result.findings and any("out of memory" in f for f in result.failures):
            # The sanitized case could not get its memory: whose it is, as for a correctness case.
            who, why = holder(workdir, cudaopt_settings, OVERHEAD, OVERHEAD)
            blame.assign(request.node, who)
            if why:
                result.failures.append(why)
        paused = begun[1]()
        if not result.passed and not result.findings and paused > 0 and result.tools.get(REQUIRED, "").startswith(
                "stopped after"):
            # Stopped and continued for other workdirs' turns, the sanitizer's run never ended: whether that was the
            # candidate's is for a run without pauses to say (the judge runs the check again; a hang again fails).
            blame.assign(request.node, blame.ENVIRONMENT)
            result.failures.append(f"its sanitized run was paused {paused:.1f} s in all for other workdirs' turns "
                                   f"beside it: run it again alone to decide")
        if not result.passed:
            pytest.fail(failure_text(result), pytrace=False)
