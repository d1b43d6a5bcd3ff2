"""What one pytest session says when time or device memory runs short: a hung import costs one timeout for the whole workdir, and a memory shortfall is never called a race."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from support import junit_cases, run_pytest

T = 4   # cudaopt_timeout of these runs, seconds
HANG = "import torch.nn as nn\nimport time\n\ntime.sleep(3600)\n"
# Items that need no import (rules that read files only) and items that import, build or run the workdir.
STATIC = ("test_rule[MN001]", "test_rule[MN005]", "test_rule[KC001]", "test_rule[KC003]", "test_rule[KD003]")
LATER = ("test_rule[MN010]", "test_extension_functions", "test_canonical[seed0]", "test_canonical[seed2]", "test_drawn_shapes",
         "test_memory_safety", "test_speedup")


def test_a_model_py_that_never_finishes_importing_costs_one_timeout_for_the_whole_run(pytester, make_workdir):
    work = make_workdir("cpu_scale", pytester.path / "wd")
    model = work / "model.py"
    model.write_text(model.read_text().replace("import torch.nn as nn\n", HANG, 1))
    result = run_pytest(pytester, "wd/model_new.py", "--cudaopt-device=cpu", "--cudaopt-ci-gate",
                        f"--cudaopt-timeout={T}", "--junitxml=j.xml", timeout=300)
    assert result.ret == 1
    cases = {name: found for (_, name), found in junit_cases(pytester.path / "j.xml").items()}
    timed_out = [name for name, (_, text) in cases.items() if "ran longer than cudaopt_timeout" in text
                 and "not run:" not in text]
    assert timed_out == ["test_extension"], timed_out     # the one item that imports before the others
    assert "model.py:7 in <module>: time.sleep(3600)" in cases["test_extension"][1]
    for name in STATIC:
        assert cases[name][0] == "passed", (name, cases[name])
    for name in LATER:
        outcome, text = cases[name]
        assert outcome in ("failed", "error") and "not run: wd/model_new.py::TestBuild::test_extension timed out" \
            in text and "model.py:7 in <module>: time.sleep(3600)" in text, (name, text)
    suite = next(ET.parse(pytester.path / "j.xml").getroot().iter("testsuite"))
    durations = [float(case.get("time") or 0) for case in suite.iter("testcase")]
    assert sum(d >= T for d in durations) == 1
    assert float(suite.get("time")) < T + 30     # one item per rule each waiting T would be 28 x T


MODEL_NEW = '''"""Runs out of memory the first time it sees a batch of 7 (as a check beside others might)."""

import torch
import torch.nn as nn

import cuda_extension

SEEN = set()


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 7 and 7 not in SEEN:
            SEEN.add(7)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (28.19 GiB free)")
        return cuda_extension.scale(x, self.weight, self.bias)
'''


def test_a_memory_shortfall_that_the_replay_did_not_meet_is_never_called_a_race(pytester, make_workdir):
    work = make_workdir("cpu_scale", pytester.path / "wd")
    (work / "model.py").write_text((work / "model.py").read_text() + '\nCUDAOPT_SHAPES = {"batch_size": [7]}\n')
    (work / "model_new.py").write_text(MODEL_NEW)
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "-k", "drawn", "--cudaopt-device=cpu",
                        "--junitxml=j.xml", "--cudaopt-report=r.json", timeout=300)
    assert result.ret == 1
    outcome, text = junit_cases(pytester.path / "j.xml")[("wd", "test_drawn_shapes")]
    assert outcome == "failed"
    assert "ran out of device memory: CUDA out of memory. Tried to allocate 20.00 GiB" in text, text
    assert "found the device memory it needs when it was replayed" in text
    assert "race" not in text and "flaky" not in text and "did not happen again" not in text
    [data] = [r["data"] for r in json.loads((pytester.path / "r.json").read_text())["results"]]
    assert data["check"] == "memory" and not data["passed"]
