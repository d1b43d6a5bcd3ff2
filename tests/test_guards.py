"""guards.py in process: each guard against a planted cheat, with NumPy standing in for a kernel."""

import importlib.util
import math
import subprocess
import sys
import re
import textwrap
import time
import types

import pytest
import torch

from doubles import LocalCandidate
from support import subprocess_env

from pytest_cudaopt.run import watchdog
from pytest_cudaopt.correctness import faults, guards, precision
from pytest_cudaopt.candidate import observe

# A "kernel" that never reaches the dispatcher: NumPy on the tensors' memory.
KERNELS = """
import numpy as np
import torch

calls = 0


def scale(x, w):
    out = torch.empty_like(x)
    np.multiply(x.numpy(), w.detach().numpy(), out=out.numpy())
    return out


def scale_skip_last(x, w):
    out = torch.empty_like(x)
    flat, xs = out.numpy().reshape(-1), x.numpy().reshape(-1)
    ws = np.broadcast_to(w.detach().numpy(), x.shape).reshape(-1)
    flat[:-1] = xs[:-1] * ws[:-1]
    return out


def scale_flaky(x, w):
    global calls
    out = scale(x, w)
    calls += 1
    if calls % 2 == 0:
        out.numpy().reshape(-1)[0] = np.nextafter(out.numpy().reshape(-1)[0], np.inf)
    return out


def scale_in_place(x, w):
    np.multiply(x.numpy(), w.detach().numpy(), out=x.numpy())
    return x
"""

CANDIDATE = """
import torch
import torch.nn as nn

import kernels

CACHE = []


class Model(nn.Module):
    def __init__(self, n=8):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return x * self.w


class Honest(Model):
    def forward(self, x):
        return kernels.scale(x, self.w)


class Cached(Model):
    def forward(self, x):
        if not CACHE:
            CACHE.append(kernels.scale(x, self.w))
        return CACHE[0]


class Mutates(Model):
    def forward(self, x):
        out = kernels.scale(x, self.w)
        x.numpy()[0, 0] = 123.0
        return out


class ReturnsInput(Model):
    def forward(self, x):
        return kernels.scale_in_place(x, self.w)


class ReturnsParameter(Model):
    def forward(self, x):
        return self.w.detach()


class ReturnsParameterObject(Model):
    def forward(self, x):
        return self.w


class Unwritten(Model):
    def forward(self, x):
        return kernels.scale_skip_last(x, self.w)


class Flaky(Model):
    def forward(self, x):
        return kernels.scale_flaky(x, self.w)


class TorchInPython(Model):
    def forward(self, x):
        y = torch.empty_like(x)          # allocation: allowed
        z = x.view(-1).view(x.shape)     # views: allowed
        return torch.mul(z, self.w)      # line 67: an op


class ChangesWeight(Model):
    def forward(self, x):
        self.w.detach().numpy()[0] = 0.0
        return kernels.scale(x, self.w)
"""


@pytest.fixture
def workdir(tmp_path):
    """A folder with the candidate module and its NumPy "kernels", imported."""
    (tmp_path / "kernels.py").write_text(textwrap.dedent(KERNELS))
    (tmp_path / "model_new.py").write_text(textwrap.dedent(CANDIDATE))
    sys.path.insert(0, str(tmp_path))
    try:
        spec = importlib.util.spec_from_file_location("guarded_model_new", tmp_path / "model_new.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernels = sys.modules["kernels"]
    finally:  # an import that failed shows its own error, not a KeyError from this clean-up
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kernels", None)
    module.kernels_module = kernels
    module.path = tmp_path
    return module


def trial(workdir, cls_name: str, **options) -> tuple[guards.Trial, list]:
    torch.manual_seed(0)
    model = workdir.Model()
    candidate = getattr(workdir, cls_name)()
    candidate.load_state_dict(model.state_dict())
    model.eval(), candidate.eval()
    t = guards.Trial(model=model, model_new=LocalCandidate(candidate, workdir=workdir.path),
                     model64=precision.float64_copy(model), workdir=workdir.path, device=torch.device("cpu"),
                     atol=1e-2, rtol=1e-2, input_names=["x"], **options)
    return t, [torch.randn(4, 8)]


def test_an_honest_candidate_passes_every_guard_and_is_fp32(workdir):
    t, inputs = trial(workdir, "Honest")
    outcome = guards.run_case(t, inputs)
    assert outcome.comparison.passed and outcome.comparison.max_abs == 0.0
    assert outcome.precision.tier == "fp32"


@pytest.mark.parametrize("cls_name, check, words", [
    ("Cached", "cached output", "returned the same tensor object returned by an earlier call"),
    ("Mutates", "input mutated", "wrote into input 0 (x) float32[4, 8] on cpu: 1 of 32 elements changed "
                                 "(first at [0, 0]:"),
    ("ReturnsInput", "output aliases input", "output float32[4, 8] on cpu is input 0 (x)"),
    ("ReturnsParameter", "output aliases state", "shares storage with ModelNew's parameter/buffer 'w'"),
    ("ReturnsParameterObject", "output type", "returned a torch.nn.parameter.Parameter as output"),
    ("Unwritten", "mismatch", "1 of 32 elements"),
    ("Flaky", "nondeterministic", "two runs of ModelNew on the same inputs differ in 1 of 32 elements"),
    ("TorchInPython", "op audit", "model_new.py:{line of torch.mul}: aten::mul.Tensor from torch.mul"),
    ("ChangesWeight", "state mutated", "changed its parameter/buffer 'w'"),
])
def test_each_guard_catches_its_cheat(workdir, cls_name, check, words):
    if "{line of torch.mul}" in words:  # the op audit names the line of model_new.py that sent the op
        source = textwrap.dedent(CANDIDATE).splitlines()
        line = next(i for i, text in enumerate(source, 1) if "torch.mul(" in text)
        words = words.replace("{line of torch.mul}", str(line))
    t, inputs = trial(workdir, cls_name)
    with pytest.raises(guards.GuardFailure) as info:
        guards.run_case(t, inputs)
    assert info.value.check == check
    assert words in info.value.message


def test_the_op_audit_lists_only_the_op_not_the_allocation_or_views(workdir):
    t, inputs = trial(workdir, "TorchInPython")
    with pytest.raises(guards.GuardFailure) as info:
        guards.run_case(t, inputs)
    assert "1 operator(s) outside the allow-list" in info.value.message
    assert "aten::empty" not in info.value.message and "aten::view" not in info.value.message


def test_allow_ops_extends_the_allow_list(workdir):
    t, inputs = trial(workdir, "TorchInPython", extra_allowed=frozenset({"aten::mul"}))
    assert guards.run_case(t, inputs).comparison.passed


def test_a_declared_nondeterministic_candidate_passes_within_the_tolerance(workdir):
    t, inputs = trial(workdir, "Flaky", nondeterministic=True)
    assert guards.run_case(t, inputs).comparison.passed


def test_an_op_sent_by_an_extension_function_is_attributed_to_cpp(workdir):
    extension = types.ModuleType("cuda_extension")
    extension.fused = torch.mul  # a builtin that sends aten::mul, like a C++ binding calling at::mul
    op_audit = observe.OpAudit(workdir.path, extension)
    with op_audit:
        extension.fused(torch.ones(2), 2.0)
    (op,) = op_audit.violations()
    assert op.from_cpp and op.caller == "cuda_extension.fused" and op.op == "aten::mul.Tensor"
    assert "sent from C++ inside cuda_extension.fused" in op.describe()


def test_memory_is_filled_with_nan_while_poisoned_and_the_flags_are_restored():
    import torch.utils.deterministic as det

    before = (torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory)
    with observe.poisoned_memory("cpu"):
        assert torch.isnan(torch.empty(64)).all()
        assert (torch.empty(4, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    assert (torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory) == before


def _check_fresh_outputs(output, inputs, model_new, earlier, names=None):
    """Every output tensor is a plain torch.Tensor with storage of its own (`unfresh_output`)."""
    found = observe.unfresh_output(output, inputs, model_new, earlier, names, guards.FILE)
    if found is not None:
        raise guards.GuardFailure(*found)


def test_fresh_outputs_may_not_share_storage_with_a_still_alive_earlier_output():
    kept = torch.zeros(10)
    history = observe.OutputHistory()
    history.add(kept)
    with pytest.raises(guards.GuardFailure, match="sharing storage with the output"):
        _check_fresh_outputs(kept[2:5], [], torch.nn.Module(), history.alive())
    dropped = torch.zeros(10)
    history.add(dropped)
    del dropped
    assert [t is kept for t in history.alive()] == [True]


def test_seeds_are_derived_per_trial_and_reproducible():
    a = guards.derive_seed(42, "canonical", 0)
    assert a == guards.derive_seed(42, "canonical", 0)
    assert a != guards.derive_seed(42, "canonical", 1) and a != guards.derive_seed(43, "canonical", 0)
    assert 0 <= a < 2**63


@pytest.mark.parametrize("exc, fault", [
    (RuntimeError("CUDA error: an illegal memory access was encountered"), True),
    (RuntimeError("CUDA error: unspecified launch failure"), True),
    (RuntimeError("expected scalar type Float"), False),
    (ValueError("CUDA error: but not a RuntimeError"), False),
])
def test_cuda_faults_are_told_from_ordinary_errors(exc, fault):
    assert faults.is_cuda_fault(exc) is fault


def test_a_faults_summary_is_the_line_naming_the_error_not_torchs_advice_after_it():
    # What torch 2.11 raises at the synchronise after a kernel wrote out of bounds.
    text = ("ModelNew.forward raised:\n"
            "AcceleratorError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
    assert faults.fault_line(text) == "AcceleratorError: CUDA error: an illegal memory access was encountered"
    assert faults.fault_line("first\nlast\n") == "last"


def test_the_watchdog_interrupts_a_sleeping_test_naming_the_test_and_case():
    with pytest.raises(watchdog.HangTimeout) as info:
        with watchdog.Watchdog(0.5, "t.py::test_x", backstop=False) as dog:
            watchdog.set_case("shape n=3")
            time.sleep(60)
    assert dog.fired
    assert str(info.value).startswith("TIMEOUT: t.py::test_x ran longer than cudaopt_timeout=0.5s on case shape n=3")


def test_a_time_limit_met_in_a_harness_step_says_so_and_never_reads_as_the_kernel_hanging():
    with pytest.raises(watchdog.HangTimeout) as info:
        with watchdog.Watchdog(0.5, "t.py::test_x", backstop=False):
            watchdog.set_case("drawn shape n=3")
            with watchdog.harness_step("moving Model's state"):
                time.sleep(60)
    text = str(info.value)
    assert text.startswith("TIMEOUT: t.py::test_x ran longer than cudaopt_timeout=0.5s on case drawn shape n=3 "
                           "while the harness was moving Model's state, its own work, not the candidate's")
    assert "raise cudaopt_timeout, or shrink model.py's constants" in text
    assert "never finishes" not in text and "deadlock" not in text


def test_the_harness_steps_are_timed_apart_from_the_candidates_time():
    with watchdog.Watchdog(30.0, "t.py::test_x", backstop=False):
        with watchdog.harness_step("running the float64 reference"):
            with watchdog.harness_step("inner"):   # counted once
                time.sleep(0.3)
        time.sleep(0.2)   # the candidate's
        spent = watchdog.harness_seconds()
    assert 0.3 <= spent < 0.45
    # a hang in the candidate's time keeps its words, and says how long the harness took of it
    with pytest.raises(watchdog.HangTimeout) as info:
        with watchdog.Watchdog(0.8, "t.py::test_x", backstop=False):
            with watchdog.harness_step("drawing the inputs"):
                time.sleep(0.5)
            time.sleep(60)
    assert "a kernel that never finishes" in str(info.value)
    assert re.search(r"\(the harness's own steps took 0\.[5-9] s of the test's 0\.[89] s\)", str(info.value))


def test_what_the_harness_attaches_to_a_timeout_survives_the_watchdogs_resignal():
    # The watchdog signals again every RESIGNAL_S until the test leaves; collecting a hung
    # worker's stacks takes longer than that, and held() keeps it from being interrupted.
    with pytest.raises(watchdog.HangTimeout) as info:
        with watchdog.Watchdog(0.3, "t.py::test_x", backstop=False):
            try:
                time.sleep(60)
            except watchdog.HangTimeout as exc:
                with watchdog.held():
                    time.sleep(4 * watchdog.RESIGNAL_S)
                    exc.worker_stacks = "the worker's stacks"
                time.sleep(4 * watchdog.RESIGNAL_S)  # raised again here: the same exception
                raise
    assert info.value.worker_stacks == "the worker's stacks"


def test_the_watchdog_ends_a_process_stuck_in_c_after_calling_on_stuck(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import ctypes
        from pytest_cudaopt.run import watchdog
        watchdog.GRACE_S = 0.5
        mutex = ctypes.create_string_buffer(64)
        libc = ctypes.CDLL(None)
        with watchdog.Watchdog(0.5, "t.py::test_x", on_stuck=lambda m: print("stuck:", m, flush=True)):
            watchdog.set_case("shape n=3")
            libc.pthread_mutex_lock(mutex)
            libc.pthread_mutex_lock(mutex)  # never returns, and no signal interrupts it
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())
    assert done.returncode == 1
    assert "cudaopt: TIMEOUT: t.py::test_x ran longer than cudaopt_timeout=0.5s on case shape n=3" in done.stderr
    assert "pthread_mutex_lock(mutex)  # never returns" in done.stderr
    assert done.stdout.startswith("stuck: TIMEOUT: t.py::test_x")


def test_the_watchdog_lets_a_quick_test_finish():
    with watchdog.Watchdog(30.0, "t.py::test_quick") as dog:
        assert watchdog.Watchdog.current is dog
    assert watchdog.Watchdog.current is None


def test_inputs_unchanged_compares_bits_so_a_nan_stays_a_nan():
    before = [torch.tensor([math.nan, 1.0])]
    guards.check_inputs_unchanged(before, [before[0].clone()])
    with pytest.raises(guards.GuardFailure, match="1 of 2 elements changed"):
        guards.check_inputs_unchanged(before, [torch.tensor([math.nan, 2.0])])


@pytest.mark.parametrize("alive, raised", [(True, "CandidateError"), (False, "CudaFault")])
def test_a_cuda_error_is_a_lost_context_only_when_the_probe_fails(monkeypatch, tmp_path, alive, raised):
    # "invalid device ordinal" (torch.cuda.set_device(99)) leaves the context usable: the probe
    # (synchronise + a one-element kernel) decides, not the error's type.
    monkeypatch.setattr(guards, "context_alive", lambda device=None: alive)
    monkeypatch.setattr(faults, "context_alive", lambda device=None: alive)
    exc = RuntimeError("CUDA error: invalid device ordinal")
    assert faults.context_lost(exc) is (not alive)
    with pytest.raises(getattr(guards, raised)):
        guards._raise_user_error(exc, tmp_path, "ModelNew.forward", guards.CandidateError)


def test_the_context_probe_reports_no_context_without_a_gpu():
    if torch.cuda.is_available():
        assert faults.context_alive()
    else:
        assert not faults.context_alive()


def test_the_poison_plan_lists_every_inactive_block_of_the_device_at_its_exact_size():
    snapshot = [
        {"device": 0, "blocks": [{"size": 4 << 20, "state": "inactive"}, {"size": 2 << 20, "state": "active_allocated"},
                                 {"size": 64 << 10, "state": "inactive"}]},
        {"device": 0, "blocks": [{"size": 20 << 20, "state": "inactive"}]},
        {"device": 1, "blocks": [{"size": 8 << 20, "state": "inactive"}]},
    ]
    assert observe.poison_plan(snapshot, 0) == [20 << 20, 4 << 20, 64 << 10]
    assert observe.poison_plan(snapshot, 1) == [8 << 20]


def test_the_op_audit_does_not_import_dynamo_in_the_process_it_runs_in(tmp_path):
    """The worker never compiles: a call under the audit must not pull in torch._dynamo and
    sympy (torch's wrapper of a mode's __torch_dispatch__ would, on its first call), seconds of
    the worker's start where torch's bytecode is not cached."""
    script = textwrap.dedent(f"""
        import sys
        import torch
        from pytest_cudaopt.candidate.observe import OpAudit
        with OpAudit({str(tmp_path)!r}) as op_audit:
            torch.ones(3).add(1)
        assert op_audit.ops, "the audit saw no op"
        print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
    """)
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env(),
                           timeout=300)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
