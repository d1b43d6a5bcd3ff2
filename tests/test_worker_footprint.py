"""What runs beside the candidate: a CPU worker serving a correctness case, a timed batch, a trace and the policy
facts loads only candidate/ and wire.py of ours (tests/test_layout.py checks that they import nothing else of
ours), at most FOOTPRINT lines of them; every line loaded there is a line the candidate can patch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import pytest_cudaopt
from pytest_cudaopt.remote.worker import Worker

FOOTPRINT = 2000
PACKAGE = Path(pytest_cudaopt.__file__).resolve().parent
# What may run in the candidate's process.
CANDIDATE_SIDE = ("pytest_cudaopt", "pytest_cudaopt.wire", "pytest_cudaopt.candidate")

MODEL = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
    def forward(self, x):
        return x * self.w
def get_inputs():
    return [torch.randn(4)]
def get_init_inputs():
    return []
"""

MODEL_NEW = """
import torch
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
    def forward(self, x):
        return x * self.w
"""


@pytest.fixture
def served(tmp_path: Path) -> dict:
    """The package's modules a CPU worker holds after one request of each kind."""
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "model.py").write_text(textwrap.dedent(MODEL))
    (wd / "model_new.py").write_text(textwrap.dedent(MODEL_NEW))
    worker = Worker(wd, None, "cpu").start()
    try:
        replies = {"policy": worker.request({"op": "policy", "mn010": True, "ex001": True})}
        key = worker.request({"op": "make", "init": [], "seed": 0})["id"]
        worker.request({"op": "load_state", "id": key, "state": {"w": torch.full((4,), 2.0)}, "buffers": {}})
        inputs = [torch.arange(4.0)]
        replies["call"] = worker.request({"op": "call", "id": key, "inputs": inputs, "device": "cpu",
                                          "allowed": [], "names": ["x"]})
        replies["time"] = worker.request({"op": "time", "id": key, "inputs": [inputs, inputs], "device": "cpu"})
        replies["trace"] = worker.request({"op": "trace", "id": key, "inputs": inputs, "device": "cpu",
                                           "flush_bytes": 1 << 10, "lead": 1e-3})
        replies["modules"] = worker.request({"op": "modules"})["modules"]
    finally:
        worker.stop()
    return replies


def _lines(file: str) -> int:
    return len(Path(file).read_text().splitlines())


def test_a_cpu_worker_serves_every_kind_of_request(served):
    assert served["policy"]["construction"] == {"line": 3, "failed": None, "model": {"w": (4,)}, "model_new": {"w": (4,)}}
    assert served["policy"]["missing"] == []
    assert torch.equal(served["call"]["output"], torch.arange(4.0) * 2)
    assert served["call"]["audit"] and served["call"]["guard"] is None   # x * w: an ATen op outside the allow-list
    assert len(served["time"]["seconds"]) == 2 and torch.equal(served["time"]["outputs"][1], torch.arange(4.0) * 2)
    assert "cudaopt::call" in {event.get("name") for event in served["trace"]["events"]}


def test_a_cpu_worker_loads_only_worker_side_modules_and_few_lines(served):
    loaded = served["modules"]
    lines = {name: _lines(file) for name, file in loaded.items() if file}
    print(f"{len(loaded)} modules, {sum(lines.values())} lines: {sorted(lines.items(), key=lambda kv: -kv[1])}")
    outside = sorted(name for name in loaded
                     if name not in CANDIDATE_SIDE and not name.startswith("pytest_cudaopt.candidate."))
    assert outside == []
    assert sum(lines.values()) <= FOOTPRINT, lines
