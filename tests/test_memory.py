"""memory.py with made-up sizes: the case budget, the shrinking size cap, queued passes that fit, the failure that says what to do."""

import contextlib

import pytest
import torch

from pytest_cudaopt.primitives import memory, tensors

GiB = memory.GiB
SOFTMAX_IN = 4096 * 393216 * 4  # KernelBench level1/23_Softmax: a 6 GiB float32 input


def test_the_case_budget_is_four_times_inputs_and_outputs_plus_two_gib():
    assert memory.case_budget(SOFTMAX_IN, SOFTMAX_IN) == 4 * 12 * GiB + 2 * GiB  # 50 GiB, the published harness' ~50 GB
    # what a case holds at its peak stays within that budget
    assert memory.case_need(SOFTMAX_IN, SOFTMAX_IN) <= memory.case_budget(SOFTMAX_IN, SOFTMAX_IN)


def test_a_problem_that_cannot_fit_fails_with_need_free_and_the_setting():
    with pytest.raises(memory.DoesNotFit, match=r"needs about 32\.00 GiB .* only 20\.00 GiB is free; "
                                                r"lower --cudaopt-max-elements"):
        memory.check_fits("case x", memory.case_need(SOFTMAX_IN, SOFTMAX_IN), 20 * GiB,
                          "lower --cudaopt-max-elements")
    memory.check_fits("case x", memory.case_need(SOFTMAX_IN, SOFTMAX_IN), 40 * GiB, "-")
    memory.check_fits("case x", 10 ** 15, None, "-")  # off CUDA nothing is checked


def test_the_size_cap_shrinks_to_free_memory_and_says_so():
    elements = 4096 * 393216
    cap, note = memory.cap_max_elements(2 * elements, elements, 2 * SOFTMAX_IN, free=80 * GiB)
    # one element costs 8 bytes (input + output); a case may use 4x that, plus 2 GiB
    assert cap == int((80 * GiB - 2 * GiB) / 32)
    assert cap < 2 * elements and "capped at" in note and "80.00 GiB" in note
    assert memory.cap_max_elements(4096, 1024, 8192, free=80 * GiB) == (4096, "")
    assert memory.cap_max_elements(4096, 1024, 8192, free=None) == (4096, "")


def test_the_perf_items_queued_passes_fit_the_case_budget_checking_fewer_outputs_only_when_they_must():
    # A queued pass holds the inputs of each of its calls, the expected and returned output of
    # each checked call and one output being made, beside an example set and one copy.
    # 1/16 GiB in and out, 4 contenders: (2 + 4) / 16 + 9 / 16 GiB of 2.5 GiB: everything fits.
    assert memory.perf_input_plan(GiB // 16, GiB // 16, 100 * GiB, 4) == (4, False, 1, "")
    # 1/4 GiB in and out: budget 4 GiB; every output checked needs 3.75 GiB, it fits.
    assert memory.perf_input_plan(GiB // 4, GiB // 4, 100 * GiB, 4) == (4, False, 1, "")
    # 1/2 GiB: budget 6 GiB; every output checked needs 7.5 GiB, one a pass 4.5 GiB.
    group, one, batch, note = memory.perf_input_plan(GiB // 2, GiB // 2, 100 * GiB, 4, max_batch=32)
    assert (group, one, batch) == (4, True, 1) and "one output checked per queued pass" in note and "6.00 GiB" in note
    # KernelBench softmax: 6 GiB in, 6 GiB out, budget 50 GiB: three contenders with one output
    # checked a pass take 48 GiB; a fourth would need 54 GiB, so it is queued in a pass of its own.
    assert memory.perf_input_plan(6 * GiB, 6 * GiB, 120 * GiB, 3)[:2] == (3, True)
    group, one, _, note = memory.perf_input_plan(6 * GiB, 6 * GiB, 120 * GiB, 4)
    assert (group, one) == (3, True) and "queued 3 at a time" in note
    # Free memory below the budget shrinks it: 30 GiB free leaves 28 GiB, two a pass (36 GiB) do not fit.
    assert memory.perf_input_plan(6 * GiB, 6 * GiB, 30 * GiB, 3)[:2] == (1, True)
    assert memory.perf_input_plan(6 * GiB, 6 * GiB, None, 4) == (4, False, 1, "")


def test_batches_of_timed_calls_take_what_fits_the_budget_and_8_gib_more():
    # 1/16 GiB in and out, 3 contenders: a pass with batches of b holds (2 + 3b) / 16 GiB of inputs
    # and (3b + (b + 2) + 1) / 16 GiB of outputs (every call's, the expected ones of the checked
    # calls, the one being made), and the candidate's gated batch b / 16 GiB of each more,
    # (9b + 5) / 16 GiB; the budget 2.5 GiB plus 8 GiB (168 / 16) fits b = 18, and b = 11 with
    # 6.5 GiB free (104 / 16 beyond the overhead).
    assert memory.perf_input_plan(GiB // 16, GiB // 16, 100 * GiB, 3, max_batch=32)[2] == 18
    assert memory.perf_input_plan(GiB // 16, GiB // 16, memory.OVERHEAD + 6.5 * GiB, 3, max_batch=64)[2] == 11
    assert memory.perf_input_plan(GiB // 16, GiB // 16, 100 * GiB, 3, max_batch=8)[2] == 8
    # Tiny tensors: the cap; 1 GiB free besides the overhead: 12 / 16 GiB for b = 1, 23 / 16 for b = 2.
    assert memory.perf_input_plan(1 << 20, 1 << 20, 100 * GiB, 3, max_batch=32)[2] == 32
    assert memory.perf_input_plan(GiB // 16, GiB // 16, memory.OVERHEAD + GiB, 3, max_batch=32)[2] == 1


def test_the_float64_run_is_planned_only_where_it_fits():
    assert memory.float64_fits(GiB, GiB, 0, 10 * GiB)
    assert not memory.float64_fits(6 * GiB, 6 * GiB, 0, 20 * GiB)   # needs 24 GiB
    assert memory.float64_fits(6 * GiB, 6 * GiB, 0, None)


def test_the_float64_run_stays_inside_the_case_budget():
    # 6 GiB in, 6 GiB out: budget 4 x 12 + 2 = 50 GiB; the float64 run needs 24 GiB.
    assert memory.float64_fits(6 * GiB, 6 * GiB, 26 * GiB, 100 * GiB)
    assert not memory.float64_fits(6 * GiB, 6 * GiB, 27 * GiB, 100 * GiB)
    assert memory.allocated("cpu") == 0


def test_nbytes_counts_every_tensor_of_a_nest():
    nest = (torch.zeros(3, dtype=torch.float32), [torch.zeros(2, dtype=torch.int64)], {"a": torch.zeros(1, dtype=torch.float16)}, 5)
    assert tensors.nbytes(nest) == 12 + 16 + 2


def test_free_bytes_is_none_where_it_cannot_be_told():
    assert memory.free_bytes("meta") is None


def test_free_bytes_releases_this_process_cache_only_where_the_device_falls_short(monkeypatch):
    # A fake device: 10 GiB free outside the cache, 30 GiB cached by this process (unallocated); a release gives
    # the cache back to the driver (what the candidate's worker can then use).
    device = {"free": 10 * GiB, "cached": 30 * GiB, "released": 0}

    def release():
        device["free"] += device["cached"]
        device["cached"], device["released"] = 0, device["released"] + 1

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (device["free"], 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: device["cached"] + GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: GiB)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", release)
    monkeypatch.setattr(torch.cuda, "device", lambda *a: contextlib.nullcontext())
    assert memory.free_bytes("cuda:0") == 40 * GiB and device["released"] == 0     # no need named: as before
    assert memory.free_bytes("cuda:0", 8 * GiB) == 40 * GiB and device["released"] == 0   # it fits outside the cache
    assert memory.free_bytes("cuda:0", 12 * GiB) == 40 * GiB and device["released"] == 1
    assert device == {"free": 40 * GiB, "cached": 0, "released": 1}
    memory.release("cpu")   # nothing to give back on the host
    assert device["released"] == 1


def test_nested_peaks_keep_their_own_figures(monkeypatch):
    # torch's one counter per device, faked: allocations raise it, a reset lowers it to now.
    state = {"now": 0, "max": 0}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["max"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: state.update(max=state["now"]))

    def allocate(n):
        state["now"] += n
        state["max"] = max(state["max"], state["now"])

    device = torch.device("cuda", 0)
    with memory.Peak(device) as item:
        allocate(20 * GiB)
        state["now"] -= 15 * GiB
        with memory.Peak(device) as case:   # from 5 GiB held: its own peak, not the item's 20
            allocate(3 * GiB)
        allocate(1 * GiB)
    assert case.bytes == 8 * GiB
    assert item.bytes == 20 * GiB


# -- host memory, planned like device memory (on the CPU) ---------------------------------------------

def test_host_free_memory_is_meminfos_available_memory_or_less_where_a_cgroup_limits_it(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20971520 kB\n")
    assert memory.host_free_bytes(str(meminfo), cgroups=()) == 20 * GiB
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text(f"{16 * GiB}\n")
    usage.write_text(f"{4 * GiB}\n")
    assert memory.host_free_bytes(str(meminfo), cgroups=((str(limit), str(usage)),)) == 12 * GiB
    limit.write_text("max\n")  # a cgroup without a limit leaves MemAvailable
    assert memory.host_free_bytes(str(meminfo), cgroups=((str(limit), str(usage)),)) == 20 * GiB
    assert memory.host_free_bytes(str(tmp_path / "none"), cgroups=()) is None
    assert memory.free_bytes("cpu") is not None and memory.where("cpu") == "host memory"


MASKED_CUMSUM = '''
import torch
import torch.nn as nn

batch_size = 32768
input_shape = (32768,)
dim = 1


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=self.dim)


def get_inputs():
    x = torch.rand(batch_size, *input_shape)
    return [x, torch.randint(0, 2, x.shape).bool()]


def get_init_inputs():
    return [dim]
'''


def test_a_cpu_case_that_cannot_fit_fails_at_once_with_the_figure_the_constants_and_the_relock_command(
        tmp_path, monkeypatch):
    # KernelBench level1/93 at its published size: 5 GiB of inputs, 4 GiB of output.
    import types

    from pytest_cudaopt.correctness import case, shapes
    from pytest_cudaopt.correctness.case import CaseFailed
    from pytest_cudaopt.results.records import SHORTFALL

    (tmp_path / "model.py").write_text(MASKED_CUMSUM)
    module = types.ModuleType("masked_cumsum")
    exec(compile(MASKED_CUMSUM, str(tmp_path / "model.py"), "exec"), module.__dict__)
    workdir = types.SimpleNamespace(reference=module, model_file=tmp_path / "model.py", path=tmp_path, worker=None)
    monkeypatch.setattr(memory, "host_free_bytes", lambda *a, **k: 20 * GiB)
    settings = types.SimpleNamespace(device="cpu")
    with pytest.raises(CaseFailed) as info:
        case._check_memory(workdir, settings, {}, "canonical inputs of get_inputs(), seed 1", "pytest x")
    text = info.value.report
    assert info.value.check == SHORTFALL
    # x * mask, 4 GiB, is held while the cumsum writes its 4 GiB output
    assert ("(inputs 5.00 GiB, outputs 4.00 GiB, the reference's intermediates 4.00 GiB) needs about 29.00 GiB of "
            "host memory, only 20.00 GiB is free") in text
    assert "model.py's constants (batch_size=32768, input_shape[0]=32768" in text
    assert f"`cudaopt init --lock-only {tmp_path}`" in text
    with shapes.applied(module, {"batch_size": 64, "input_shape[0]": 64}):
        case._check_memory(workdir, settings, {"batch_size": 64}, "drawn", "")   # a small case fits


def test_init_says_when_the_canonical_size_cannot_fit_this_machine(tmp_path, capsys, monkeypatch):
    from pytest_cudaopt import cli

    model = tmp_path / "93_masked_cumsum.py"
    model.write_text(MASKED_CUMSUM)
    monkeypatch.setattr(memory, "host_free_bytes", lambda *a, **k: 20 * GiB)
    assert cli.main(["init", str(tmp_path / "wd"), "--model", str(model), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "cudaopt init: warning: one correctness case at model.py's sizes (inputs 5.00 GiB, outputs 4.00 GiB, the " \
           "reference's intermediates 4.00 GiB) needs about 29.00 GiB of host memory, only 20.00 GiB is free" in err
    assert f"shrink them in {tmp_path / 'wd' / 'model.py'}, then record the change with " \
           f"`cudaopt init --lock-only {tmp_path / 'wd'}`" in err
    monkeypatch.setattr(memory, "host_free_bytes", lambda *a, **k: 64 * GiB)
    assert cli.main(["init", str(tmp_path / "wd2"), "--model", str(model), "--device", "cpu"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_skipped_float64_run_says_what_it_needs_what_this_process_holds_and_what_is_free(monkeypatch):
    from pytest_cudaopt.correctness import precision

    monkeypatch.setattr(memory, "free_bytes", lambda *a, **k: 3 * GiB)
    monkeypatch.setattr(memory, "allocated", lambda *a, **k: 20 * GiB)
    model = torch.nn.Identity()
    inputs = [torch.ones(4)]
    out, why = precision.run_float64(model, inputs, model(*inputs), "cpu")
    assert out is None and why.startswith("float64 reference skipped: it needs about "), why
    assert why.endswith("beside the 20.00 GiB this process holds, or the 3.00 GiB free"), why


HINGE_LOSS = '''
import torch
import torch.nn as nn

batch_size = 32768
input_shape = (32768,)


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size,)).float() * 2 - 1]


def get_init_inputs():
    return []
'''


def _module(tmp_path, source: str, name: str):
    import types

    (tmp_path / "model.py").write_text(source)
    module = types.ModuleType(name)
    exec(compile(source, str(tmp_path / "model.py"), "exec"), module.__dict__)
    return module


def test_the_references_intermediates_on_meta_count_each_storage_once_and_leave_inputs_and_views_out():
    with torch.device("meta"):
        p, t = torch.empty(1024, 1024), torch.empty(1024)
        with memory.Intermediates([p, t]) as held:
            out = torch.mean(torch.clamp(1 - p * t, min=0))
        assert held.peak == 2 * p.nbytes   # 1 - p * t holds p * t and its own result at once
        x = torch.empty(1024, 1024)
        with memory.Intermediates([x]) as held:
            x.add_(1)
            y = x.view(-1)[:10]
            z = torch.relu(x)
            w = z.view(1024, 1024).t()
        assert held.peak == x.nbytes and held.now == x.nbytes   # only z, its views not again
        del z, w
        assert held.now == 0 and out.shape == () and y.shape == (10,)


def test_a_hinge_loss_at_kernelbenchs_size_is_refused_before_its_intermediates_exhaust_the_host(tmp_path, monkeypatch):
    # KernelBench level1/100_HingeLoss: 4 GiB of predictions, two [32768, 32768] intermediates at once in the
    # reference. Planned on inputs and outputs alone (14 GiB) it started on a 23 GiB machine and was killed there.
    from pytest_cudaopt.correctness import case, shapes
    from pytest_cudaopt.correctness.case import CaseFailed

    module = _module(tmp_path, HINGE_LOSS, "hinge_loss")
    check = shapes.check_on_meta(module, {})
    assert check.work_bytes == 8 * GiB - 4 and check.input_bytes == 4 * GiB + 32768 * 4
    workdir = types_namespace(reference=module, model_file=tmp_path / "model.py", path=tmp_path, worker=None)
    monkeypatch.setattr(memory, "host_free_bytes", lambda *a, **k: 20 * GiB)
    with pytest.raises(CaseFailed) as info:
        case._check_memory(workdir, types_namespace(device="cpu"), {}, "canonical inputs", "")
    assert "the reference's intermediates 8.00 GiB) needs about 22.00 GiB of host memory, only 20.00 GiB" \
           in info.value.report


def types_namespace(**kwargs):
    import types

    return types.SimpleNamespace(**kwargs)


def test_a_host_short_of_memory_first_lets_go_of_the_last_cases_tensors_then_plans_again(tmp_path, monkeypatch):
    from pytest_cudaopt.correctness import case
    from pytest_cudaopt.correctness.case import CaseFailed

    module = _module(tmp_path, HINGE_LOSS, "hinge_loss")
    pings = []
    worker = types_namespace(proc=types_namespace(pid=1), ping=lambda: pings.append(1))
    workdir = types_namespace(reference=module, model_file=tmp_path / "model.py", path=tmp_path, worker=worker)
    # 20 GiB free until the worker drops the last reply it keeps, 24 after
    monkeypatch.setattr(memory, "host_free_bytes", lambda *a, **k: (24 if pings else 20) * GiB)
    need, _budget, work = case._check_memory(workdir, types_namespace(device="cpu"), {}, "canonical inputs", "")
    assert pings == [1] and round(need / GiB, 2) == 22.0 and work == 8 * GiB - 4
    pings.clear()
    monkeypatch.setattr(memory, "host_free_bytes", lambda *a, **k: 20 * GiB)   # nothing to let go of
    with pytest.raises(CaseFailed, match="only 20.00 GiB is free"):
        case._check_memory(workdir, types_namespace(device="cpu"), {}, "canonical inputs", "")
    assert pings == [1]


def test_a_float64_run_is_skipped_where_its_intermediates_would_not_fit(monkeypatch):
    from pytest_cudaopt.correctness import precision

    monkeypatch.setattr(memory, "free_bytes", lambda *a, **k: 3 * GiB)
    model = torch.nn.Identity()
    inputs = [torch.ones(4)]
    out, why = precision.run_float64(model, inputs, model(*inputs), "cpu", work_bytes=2 * GiB)
    assert out is None and why.startswith("float64 reference skipped: it needs about 4.00 GiB (4.00 GiB of it "
                                          "intermediates)"), why
    out, why = precision.run_float64(model, inputs, model(*inputs), "cpu")
    assert why == "" and out.dtype == torch.float64


def test_the_worker_lets_go_of_a_calls_inputs_once_it_replied_and_of_its_reply_at_the_next_request(tmp_path):
    # Inputs over the arena travel as torch's shared-memory files; a file the worker still maps is host memory the
    # next case's plan cannot count on.
    import os
    import textwrap

    from pytest_cudaopt.remote.worker import Worker

    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "model.py").write_text(textwrap.dedent('''
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return x + 1
        def get_inputs():
            return [torch.randn(4)]
        def get_init_inputs():
            return []
        '''))
    (wd / "model_new.py").write_text(textwrap.dedent('''
        import torch
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                return x + 1
        '''))

    def mapped(pid: int) -> set[str]:
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as handle:
            return {line.split("/dev/shm/")[1].split()[0] for line in handle if "/dev/shm/torch_" in line}

    worker = Worker(wd, None, "cpu").start()
    try:
        key = worker.request({"op": "make", "init": [], "seed": 0})["id"]
        inputs = [torch.randn(32 << 20)]   # 128 MiB
        reply = worker.request({"op": "call", "id": key, "inputs": inputs, "device": "cpu", "allowed": [],
                                "names": ["x"]})
        assert torch.equal(reply["output"], inputs[0] + 1)
        held = mapped(worker.proc.pid)
        assert not [name for name in held if name.startswith(f"torch_{os.getpid()}_")], held   # the inputs
        assert held, "the reply is kept until the next request"
        del reply
        worker.ping()
        assert not mapped(worker.proc.pid)
    finally:
        worker.stop()


# Records, at each item's start, the CPU tensors of a megabyte or more this process still holds. The cycle
# collector is off: what a failed case left must be let go of by reference counts, as a busy judge cannot wait.
HELD_AT_EACH_ITEM = '''
import gc
import json

import torch

gc.disable()
seen = []


def pytest_runtest_setup(item):
    seen.append([item.name, [list(o.shape) for o in gc.get_objects() if isinstance(o, torch.Tensor)
                             and o.device.type == "cpu" and o.dtype == torch.float32
                             and o.untyped_storage().nbytes() >= 1 << 20]])


def pytest_sessionfinish(session):
    with open("held.json", "w") as handle:
        json.dump(seen, handle)
'''


def test_a_failed_case_holds_none_of_its_tensors_while_the_next_case_runs(pytester, make_workdir):
    import json

    from support import run_pytest

    from pytest_cudaopt import policy

    work = make_workdir("cpu_scale", pytester.path / "wd")
    model = (work / "model.py").read_text()
    (work / "model.py").write_text(model.replace("batch_size = 16", "batch_size = 512").replace(
        "features = 64", "features = 1024"))   # 2 MiB inputs
    text = (work / "model_new.py").read_text()
    (work / "model_new.py").write_text(text.replace("self.bias)", "self.bias) + 0"))   # an op the audit refuses
    policy.write_lock(work)
    (pytester.path / "conftest.py").write_text(HELD_AT_EACH_ITEM)
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "-k", "canonical", "--cudaopt-device=cpu",
                        timeout=300)
    assert result.ret == 1 and "op audit" in result.stdout.str(), result.stdout.str()[-2000:]
    held = json.loads((pytester.path / "held.json").read_text())
    assert [name for name, _ in held] == ["test_canonical[seed0]", "test_canonical[seed1]", "test_canonical[seed2]"]
    assert all(not shapes for _, shapes in held), held
