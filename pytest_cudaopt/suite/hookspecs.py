"""The hooks cudaopt declares: what the plugin's own tests may plug in instead of the perf items' clock and tracer."""

from __future__ import annotations

import pytest


class CudaoptHooks:
    @pytest.hookspec(firstresult=True)
    def pytest_cudaopt_perf_clock(self, config: pytest.Config, device: str):
        """The clock of the perf items (e.g. tests/doubles.py's `FakeClock`); None: the default clock."""

    @pytest.hookspec(firstresult=True)
    def pytest_cudaopt_perf_tracer(self, config: pytest.Config, device: str):
        """The kernel tracer of the perf items (e.g. tests/doubles.py's `FakeTracer`); None: the default tracer."""
