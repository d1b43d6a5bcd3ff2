"""Isolation in one process: each road from candidate code to the reference and the baselines (attributes, flags, imports, the dispatcher) is seen, named, put back or taints the process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pytest_cudaopt import isolation
from pytest_cudaopt.isolation import GRAD_MODE, Watch, dispatcher
from pytest_cudaopt.isolation.changes import shown_origin, workdir_path

HERE = Path(__file__).resolve()


def _lines(watch_or_snapshot, **kwargs) -> list[str]:
    return [c.line() for c in isolation.changes(watch_or_snapshot, **kwargs)]


@pytest.fixture
def watch() -> Watch:
    watch = Watch()
    watch.trust()
    return watch


def _fake_softmax(t, dim=-1, *args, **kwargs):
    return torch.sigmoid(t)


def test_an_untouched_process_shows_no_change(watch):
    F.softmax(torch.randn(4, 8), dim=-1)
    assert watch.verify("after a call") == ""
    assert watch.trusted.unwatched == []  # this torch offers every road


def test_what_torch_does_lazily_is_not_a_change(watch):
    """torch._dynamo wraps torch.manual_seed and nn.Module.__init__ when first used; the
    profiler, torch.compile and deterministic mode register kernels of their own."""
    model = torch.nn.Linear(8, 8)
    compiled = torch.compile(lambda x: F.softmax(model(x), dim=-1))
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    with torch.profiler.profile():
        model(torch.randn(2, 8))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.use_deterministic_algorithms(was)
    assert watch.verify("after torch's own work") == ""


def test_a_replaced_torch_function_is_named_with_the_file_that_defined_it_and_put_back(watch):
    original = torch.softmax
    torch.softmax = _fake_softmax
    try:
        failure = watch.verify("found after importing model_new.py", HERE.parent)
    finally:
        replaced_still = torch.softmax is _fake_softmax
        torch.softmax = original
    assert "candidate code changed what the reference and the baselines run (found after importing model_new.py)" \
        in failure
    assert "attribute torch.softmax: was <built-in method softmax" in failure
    assert f"defined in {HERE.name}:" in failure
    assert not replaced_still  # verify() put the original back
    assert watch.verify("again") == "" and not watch.tainted


@pytest.mark.parametrize("owner, name", [
    (torch.nn.functional, "softmax"), (torch.nn.Linear, "forward"), (torch.nn.Module, "__call__"),
    (sys.modules["torch.nn.modules.linear"], "F"), (torch.cuda, "synchronize"), (__import__("math"), "sqrt"),
])
def test_every_namespace_the_reference_reaches_is_watched(watch, owner, name):
    original = vars(owner)[name]
    setattr(owner, name, _fake_softmax)
    try:
        [change] = isolation.changes(watch.trusted)
    finally:
        setattr(owner, name, original)
    assert change.road == "attribute" and change.what.endswith(f".{name}")


def test_a_method_added_to_torch_tensor_shadows_the_base_class_and_is_removed(watch):
    assert "softmax" not in vars(torch.Tensor)  # it lives in torch._C.TensorBase
    torch.Tensor.softmax = _fake_softmax
    failure = watch.verify("after a call")
    assert "attribute torch.Tensor.softmax: added: <function _fake_softmax" in failure
    assert "softmax" not in vars(torch.Tensor)
    assert torch.randn(3).softmax(0).sum().item() == pytest.approx(1.0)


def test_a_torch_function_assigned_to_another_name_is_not_trusted_as_torch_code(watch):
    original = torch.softmax
    torch.softmax = torch.sigmoid  # torch's own builtin, but not torch's own wrapping of softmax
    try:
        [change] = isolation.changes(watch.trusted)
    finally:
        torch.softmax = original
    assert change.what == "torch.softmax" and "now <built-in method sigmoid" in change.detail


def test_python_run_from_a_string_is_named_as_such(watch):
    exec("import torch\ntorch.softmax = lambda t, dim=-1, *a, **k: torch.sigmoid(t)", {})
    failure = watch.verify("found after importing cuda_extension, built from kernels/")
    assert "attribute torch.softmax" in failure
    assert "defined in <string>:2: Python code without a file of its own (pybind11::exec or eval in kernels/" \
        in failure
    assert torch.softmax(torch.zeros(2), 0).tolist() == [0.5, 0.5]


@pytest.mark.parametrize("change, flag", [
    (lambda: torch.set_float32_matmul_precision("medium"), "torch.get_float32_matmul_precision()"),
    (lambda: setattr(torch.backends.cudnn, "allow_tf32", not torch.backends.cudnn.allow_tf32),
     "torch.backends.cudnn.allow_tf32"),
    (lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", not torch.backends.cuda.matmul.allow_tf32),
     "torch.backends.cuda.matmul.allow_tf32"),
    (lambda: torch.set_default_dtype(torch.float64), "torch.get_default_dtype()"),
    (lambda: torch.set_num_threads(max(1, torch.get_num_threads() - 1) if torch.get_num_threads() > 1 else 2),
     "torch.get_num_threads()"),
    (lambda: torch.use_deterministic_algorithms(True), "torch.are_deterministic_algorithms_enabled()"),
])
def test_a_changed_global_flag_is_named_and_put_back(watch, change, flag):
    before = watch.trusted.flags[flag]
    change()
    failure = watch.verify("found after a call of ModelNew.forward")
    assert f"flag {flag}: was {before!r}" in failure or f"flag {flag}: was " in failure
    assert isolation.take().flags[flag] == before and not watch.tainted


def test_a_grad_mode_the_caller_set_is_not_a_change(watch):
    with torch.no_grad():
        assert watch.verify("inside no_grad", context={GRAD_MODE: False}) == ""
        torch.set_grad_enabled(True)  # the candidate turned autograd back on for the baselines
        failure = watch.verify("inside no_grad", context={GRAD_MODE: False})
    assert "flag torch.is_grad_enabled(): was False, now True" in failure


def test_a_mode_left_on_the_dispatch_stack_is_a_change(watch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sigmoid(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = Sigmoid()
    mode.__enter__()
    try:
        found = isolation.changes(watch.trusted)
    finally:
        mode.__exit__(None, None, None)
    assert "the torch dispatch mode stack" in [c.what for c in found if c.road == "flag"]


def test_a_replaced_torch_module_in_sys_modules_is_named_and_put_back(watch):
    import types

    fake = types.ModuleType("torch.nn.functional")
    real = sys.modules["torch.nn.functional"]
    sys.modules["torch.nn.functional"] = fake
    failure = watch.verify("found after importing model_new.py")
    assert "import sys.modules['torch.nn.functional']: was <module 'torch.nn.functional'" in failure
    assert sys.modules["torch.nn.functional"] is real


def test_an_import_hook_of_a_workdir_is_a_change_one_of_an_installed_package_is_not(watch):
    class Finder:
        def find_spec(self, *args, **kwargs):
            return None

    sys.meta_path.insert(0, Finder())
    failure = watch.verify("found after importing model_new.py")
    assert "import sys.meta_path: added <" in failure and f"defined in {HERE}" in failure
    assert not any(isinstance(hook, Finder) for hook in sys.meta_path)
    import hypothesis.internal.conjecture.junkdrawer as installed  # noqa: F401  (a package's own gc hook)

    assert isolation.changes(watch.trusted) == []


def test_a_tracer_of_an_installed_package_is_not_a_change_one_of_a_workdir_is(watch):
    from hypothesis.internal.scrutineer import Tracer  # what Hypothesis's explain phase installs

    from pytest_cudaopt.isolation import namespaces

    def workdir_tracer(frame, event, arg):  # as a model_new.py would define it
        return None

    previous_trace, previous_profile = sys.gettrace(), sys.getprofile()
    try:
        sys.settrace(Tracer(should_trace=True).trace)
        installed = [c.line() for c in namespaces.import_changes(watch.trusted.imports)]
        sys.settrace(None)
        sys.setprofile(workdir_tracer)
        found = [c.line() for c in namespaces.import_changes(watch.trusted.imports)]
    finally:
        sys.settrace(previous_trace)
        sys.setprofile(previous_profile)
    assert installed == []
    assert len(found) == 1 and found[0].startswith("import sys.getprofile(): was None, now <function "), found
    assert f"defined in {HERE}" in found[0]


def test_a_kernel_registered_from_python_for_an_aten_op_taints_the_process(watch):
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("_softmax", lambda x, dim, half: torch.sigmoid(x), "CPU")
        failure = watch.verify("found after importing model_new.py", HERE.parent)
        later = watch.verify("a later item")
    finally:
        lib._destroy()
    assert "dispatcher aten::_softmax / CPU: a kernel registered at " in failure
    assert f"(defined in {HERE.name}:" in failure
    assert watch.tainted and "changed dispatcher aten::_softmax / CPU" in watch.tainted
    assert later.startswith("not judged: an earlier item found that candidate code")


def test_an_extension_may_define_ops_in_a_namespace_of_its_own_but_not_in_aten(watch):
    own = torch.library.Library("cudaopt_isolation_test", "DEF")
    aten = torch.library.Library("aten", "FRAGMENT")
    try:
        own.define("scale(Tensor x) -> Tensor")
        own.impl("scale", lambda x: x, "CPU")
        assert isolation.changes(watch.trusted) == []
        aten.define("cudaopt_isolation_test(Tensor x) -> Tensor")
        [change] = isolation.changes(watch.trusted)
    finally:
        own._destroy()
        aten._destroy()
    assert change.what == "aten::cudaopt_isolation_test"
    assert "a new operator in the existing namespace aten" in change.detail


def test_a_python_dispatcher_kernel_is_named_and_removed(watch):
    from torch._C import DispatchKey

    op = torch.ops.aten.mm.default
    before = dict(op.py_kernels)
    op.py_impl(DispatchKey.CompositeImplicitAutograd)(lambda a, b: a)
    failure = watch.verify("found after a call of ModelNew.forward")
    assert "dispatcher aten.mm.default / CompositeImplicitAutograd (Python dispatcher)" in failure
    assert dict(op.py_kernels) == before and not watch.tainted


def test_a_backend_fallback_is_a_change():
    snapshot = isolation.take()
    lib = torch.library.Library("_", "IMPL")
    try:
        lib.fallback(lambda *a, **k: None, dispatch_key="PrivateUse3")
        [change] = isolation.changes(snapshot)
    finally:
        lib._destroy()
    assert change.what == "backend fallback / PrivateUse3"


def test_without_the_full_check_the_kernels_are_left_to_the_items_end():
    snapshot = isolation.take()
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("_softmax", lambda x, dim, half: torch.sigmoid(x), "CPU")
        assert isolation.changes(snapshot, full=False) == []
        assert [c.what for c in isolation.changes(snapshot)] == ["aten::_softmax / CPU"]
    finally:
        lib._destroy()


def test_a_torch_without_the_dispatcher_api_says_the_road_is_not_verified(monkeypatch):
    monkeypatch.setattr(dispatcher, "missing_api", lambda: ["torch._C._dispatch_dump"])
    snapshot = isolation.take()
    assert snapshot.registrations is None
    assert "the dispatcher (this torch lacks torch._C._dispatch_dump)" in snapshot.unwatched


def test_a_failure_lists_a_dozen_changes_and_counts_the_rest(watch):
    originals = {name: getattr(torch, name) for name in ("relu", "tanh", "exp", "log", "sin", "cos", "abs",
                                                         "neg", "sqrt", "erf", "floor", "ceil", "round", "sign")}
    for name in originals:
        setattr(torch, name, _fake_softmax)
    failure = watch.verify("found after a call")
    assert failure.count("\n  attribute torch.") == 12 and "  ... and 2 more" in failure
    assert all(getattr(torch, name) is fn for name, fn in originals.items())


def test_paths_are_shown_relative_to_the_workdir(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "x_binding.cpp").write_text("")
    assert workdir_path("../../../kernels/x_binding.cpp:12", tmp_path) == "kernels/x_binding.cpp:12"
    assert workdir_path(f"{tmp_path}/model_new.py:3", tmp_path) == "model_new.py:3"
    assert workdir_path("/elsewhere/lib.py:9", tmp_path) == "/elsewhere/lib.py:9"
    assert shown_origin("module cudaopt_ext_0123_1.cuda_extension", tmp_path) == \
        "a function of cuda_extension (kernels/)"


# -- frames and the object graph (introspection) ------------------------------------------------

CANDIDATE = '''\
import gc
import inspect
import sys


def getframe():
    return sys._getframe(1)  # line 7


def generator_frame():
    gen = (i for i in range(1))
    return gen.gi_frame  # line 12


def traceback_frame():
    try:
        raise ValueError
    except ValueError as exc:
        return exc.__traceback__.tb_frame  # line 19


def through_inspect():
    return inspect.currentframe()  # line 23


def every_object():
    return len(gc.get_objects())  # line 27


def through(helper):
    return helper()  # line 31


def module_name_lookups():
    import collections
    import typing

    return collections.namedtuple("Pair", "a b"), typing.TypeVar("T")
'''


@pytest.fixture
def candidate(tmp_path):
    """A module whose file is watched as a model_new.py is."""
    import importlib.util

    from pytest_cudaopt.isolation import introspection

    path = tmp_path / "model_new.py"
    path.write_text(CANDIDATE)
    spec = importlib.util.spec_from_file_location("cudaopt_test_candidate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    Watch()  # a new session: nothing watched, nothing read
    introspection.watch_file(path)
    yield module
    introspection.reset()


def test_every_way_to_a_frame_from_a_watched_file_is_noted_with_its_line(candidate, tmp_path):
    from pytest_cudaopt.isolation import introspection

    candidate.getframe()
    candidate.generator_frame()
    candidate.traceback_frame()
    candidate.through_inspect()  # inspect is the standard library: the read is the caller's
    candidate.every_object()
    shown = [r.line_text(tmp_path) for r in introspection.take_readings()]
    assert shown == ["sys._getframe() at model_new.py:7", ".gi_frame at model_new.py:12",
                     ".tb_frame at model_new.py:19", "sys._getframe() at model_new.py:23",
                     "gc.get_objects() at model_new.py:27"]
    assert introspection.take_readings() == []


def test_frames_read_by_other_code_do_not_count_even_when_a_watched_file_called_it(candidate):
    from pytest_cudaopt.isolation import introspection

    sys._getframe(0)  # this file is not watched
    candidate.through(lambda: sys._getframe(1))  # the read is made here
    candidate.module_name_lookups()  # the standard library reads its caller's frame for __module__
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))  # dynamo reads frames
    assert introspection.take_readings() == []


def test_a_read_fails_the_next_verification_and_leaves_no_later_verdict_standing(candidate, tmp_path):
    watch = Watch()
    watch.trust()
    from pytest_cudaopt.isolation import introspection

    introspection.watch_file(tmp_path / "model_new.py")
    candidate.getframe()
    message = watch.verify("found after a call", tmp_path)
    assert message.splitlines()[:2] == [
        "candidate code read the interpreter's frames or object graph (found after a call):",
        "  sys._getframe() at model_new.py:7"]
    later = watch.verify("found after the next call", tmp_path)
    assert later.startswith("not judged: an earlier item found that candidate code in ")
    assert "read the interpreter's frames or object graph (sys._getframe() at model_new.py:7" in later


# ------------------------------------------------------------------ the reference itself

def _reference_module(tmp_path: Path):
    """A model.py imported as the session imports one: a module of its own, classes defined there."""
    import importlib.util

    (tmp_path / "model.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Block(nn.Module):\n    def forward(self, x):\n"
        "        return torch.softmax(x, dim=-1)\n\n\nclass Model(nn.Module):\n    def forward(self, x, scale=1.0):\n"
        "        return Block()(x) * scale\n\n\nbatch_size = 4\n")
    spec = importlib.util.spec_from_file_location("cudaopt_workdir_test_reference.model", tmp_path / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_references_classes_are_watched_once_it_is_trusted(tmp_path):
    module = _reference_module(tmp_path)
    watch = Watch()
    watch.trust(reference=module)
    original = module.Block.forward
    module.Block.forward = _fake_softmax
    module.batch_size = 9   # data: the drawn-shape cases set constants themselves
    failure = watch.verify("found after a call of ModelNew.forward")
    assert "attribute model.Block.forward: was <function Block.forward" in failure
    assert f"(defined in {HERE.name}:" in failure or "test_isolation.py" in failure
    assert module.Block.forward is original and not watch.tainted   # put back
    module.batch_size = 4
    assert watch.verify("again") == ""


def test_a_function_whose_code_or_defaults_are_replaced_in_place_is_a_change(tmp_path):
    module = _reference_module(tmp_path)
    watch = Watch()
    watch.trust(reference=module)
    forward = module.Model.forward
    code, defaults = forward.__code__, forward.__defaults__
    forward.__code__ = _fake_softmax.__code__.replace(co_name="forward")
    forward.__defaults__ = (2.0,)
    failure = watch.verify("found after importing model_new.py")
    assert "attribute model.Model.forward: the same function, its __code__ and __defaults__ replaced" in failure
    assert forward.__code__ is code and forward.__defaults__ is defaults   # put back


def test_torchs_own_python_functions_are_watched_for_replaced_code_too(watch):
    code = F.softmax.__code__
    F.softmax.__code__ = _fake_softmax.__code__
    try:
        failure = watch.verify("found after a call")
    finally:
        F.softmax.__code__ = code
    assert "attribute torch.nn.functional.softmax: the same function, its __code__ replaced" in failure


def test_a_forward_hook_on_every_module_is_a_change_and_is_put_back(watch):
    """Such a hook runs after the reference's Model.forward too, and may replace its output."""
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, inputs, output: output)
    try:
        failure = watch.verify("found after a call of ModelNew.forward")
        assert "flag the global nn.Module hooks: was none, now _global_forward_hooks: " in failure
        assert not torch.nn.modules.module._global_forward_hooks   # put back
        assert watch.verify("again") == "" and not watch.tainted
    finally:
        handle.remove()


def test_a_compiler_setting_that_slows_the_torch_compile_baseline_is_a_change_and_is_put_back(watch):
    import torch._inductor.config as inductor_config

    watch.trust()   # with torch._inductor loaded (the plugin loads it before any workdir code runs)
    before = inductor_config.max_fusion_size
    inductor_config.max_fusion_size = 1   # no fusion: a slower baseline, a faster-looking candidate
    try:
        failure = watch.verify("found after ModelNew's first calls, before the baselines were compiled")
        assert f"flag torch._inductor.config: max_fusion_size was {before}, now 1" in failure
        assert inductor_config.max_fusion_size == before and watch.verify("again") == ""   # put back
    finally:
        inductor_config.max_fusion_size = before
