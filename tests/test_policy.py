"""The workdir rules: the gallery of planted violations, the checkers' corners, `cudaopt check`, `pytest -m policy`."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import sys
import textwrap
import types
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest

from support import run_python
from pytest_cudaopt import cli, policy
from pytest_cudaopt.policy import cpp_checks, rules

REPO_ROOT = Path(__file__).resolve().parents[1]
GALLERY = Path(__file__).resolve().parent / "policy_gallery"
CASES = sorted(p.name for p in GALLERY.iterdir() if p.is_dir() and p.name != "__pycache__")
MARKER = re.compile(r"EXPECT: ((?:[A-Z]{2}\d{3}[ ,]*)+)")


def assemble(case: str, dest: Path) -> Path:
    """A workdir at `dest`: the gallery's clean workdir, the fixed files and utils/ from the
    templates, a lock, then the case's files on top (see `case.toml` for deletions and relock)."""
    shutil.copytree(GALLERY / "clean", dest)
    for name in policy.PROTECTED_TEMPLATES:
        shutil.copyfile(policy.TEMPLATES / name, dest / name)
    shutil.copytree(policy.TEMPLATES / "utils", dest / "utils", ignore=shutil.ignore_patterns("__pycache__"))
    policy.write_lock(dest)
    spec = case_spec(case)
    for path in overlay_files(case):
        target = dest / path.relative_to(GALLERY / case)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    for name in spec.get("delete", []):
        (dest / name).unlink()
    if spec.get("relock", True) and "cudaopt.lock" not in spec.get("delete", []):
        policy.write_lock(dest)
    return dest


def case_spec(case: str) -> dict:
    path = GALLERY / case / "case.toml"
    return tomllib.loads(path.read_text()) if path.is_file() else {}


def overlay_files(case: str) -> list[Path]:
    if case == "clean":
        return []
    return sorted(p for p in (GALLERY / case).rglob("*") if p.is_file() and p.name != "case.toml"
                  and "__pycache__" not in p.parts)


def expected(case: str) -> set[tuple[str, int, str]]:
    """(path, line, rule) of every `EXPECT: RULE` marker in the case's files, plus case.toml's `expect`."""
    found = set()
    for path in overlay_files(case):
        rel = path.relative_to(GALLERY / case).as_posix()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = MARKER.search(line)
            if match:
                found |= {(rel, number, rule) for rule in re.findall(r"[A-Z]{2}\d{3}", match.group(1))}
    for entry in case_spec(case).get("expect", []):
        path, line, rule = (part.strip() for part in entry.split(":"))
        found.add((path, int(line), rule))
    return found


def found(violations: list[policy.Violation]) -> set[tuple[str, int, str]]:
    return {(v.path, v.line, v.rule) for v in violations}


@pytest.fixture
def clean_workdir(tmp_path: Path) -> Path:
    return assemble("clean", tmp_path / "clean")


# --------------------------------------------------------------------------- the gallery

@pytest.mark.parametrize("case", CASES)
def test_gallery_case_reports_exactly_its_planted_violations(case: str, tmp_path: Path) -> None:
    workdir = assemble(case, tmp_path / case)
    violations = policy.check_workdir(workdir)
    assert found(violations) == expected(case), "\n".join(map(str, violations))


def test_the_gallery_plants_every_rule_and_has_clean_cases() -> None:
    planted = {rule for case in CASES for (_, _, rule) in expected(case)}
    assert planted == set(policy.RULE_IDS)
    assert {c for c in CASES if not expected(c)} >= {"clean", "config_relaxations_pass", "cv001_conv_with_cudnn_passes"}


def test_a_forbidden_include_behind_a_local_header_names_the_chain(tmp_path: Path) -> None:
    workdir = assemble("kc002_header_outside_kernels", tmp_path / "wd")
    [violation] = policy.check_workdir(workdir)
    assert violation.path == "include/fast_math.h"
    assert "CuTe is not allowed" in violation.message
    assert "reached through kernels/gelu.cu:7" in violation.message


def test_a_torch_header_in_a_cu_file_is_reported_through_local_headers(tmp_path: Path) -> None:
    workdir = assemble("clean", tmp_path / "wd")
    (workdir / "kernels" / "common.cuh").write_text('#pragma once\n#include "../binding_registry.h"\n')
    [violation] = [v for v in policy.check_workdir(workdir) if v.rule == "KC003"]
    assert (violation.path, violation.line) == ("kernels/gelu.cu", 6)
    assert '#include "common.cuh" -> kernels/common.cuh:2: #include "../binding_registry.h"' in violation.message


def test_messages_name_the_operator_and_the_function(tmp_path: Path) -> None:
    workdir = assemble("mn003_helper_function", tmp_path / "wd")
    [violation] = policy.check_workdir(workdir)
    assert "torch.nn.functional.layer_norm() is a torch op" in violation.message
    assert "(in _normalise)" in violation.message


# --------------------------------------------------------------------------- model_new.py corners

FORWARD_TEMPLATE = '''\
import contextlib
import math

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)
        # Tensors forward reads besides Model's parameters; not in the state dict, which must match Model's (MN010).
        self.register_buffer("weight", torch.empty(out_features), persistent=False)
        self.register_buffer("table", torch.zeros(4), persistent=False)
        self.n = in_features
        self.op = cuda_extension.gelu

    def _helper(self, x, k: int):
        return cuda_extension.op(x, k * 2)

    def forward(self, x):
{body}
'''

ALLOWED_FORWARDS = [
    "B, C = x.shape\nout = torch.empty(B, C, device=x.device, dtype=x.dtype)\ncuda_extension.op(x, out)\nreturn out",
    "n = x.size(0) * 2 + x.numel() // self.n - math.ceil(x.stride(0) / 3)\nreturn cuda_extension.op(x, n)",
    "if x.dim() != 2 or x.size(-1) != self.n:\n"
    "    raise ValueError(f'x must be (N, {self.n}), got {tuple(x.shape)}')\n"
    "return cuda_extension.op(x)",
    "assert x.is_contiguous(), 'x must be contiguous'\nreturn cuda_extension.op(x)",
    "out = x.new_empty(x.shape)\ncuda_extension.op(x, out, self.weight, self.table, self.fc.bias)\nreturn out",
    "for i in range(x.size(0)):\n    cuda_extension.op(x, i)\nreturn x",
    "with torch.no_grad():\n    return cuda_extension.op(x)",
    "a, b = cuda_extension.split(x)\nreturn cuda_extension.add(a, b)",
    "if x is None:\n    return None\nreturn self.op(x, None, 1.0)",
    "shape = (*x.shape[:-1], self.n)\nreturn cuda_extension.op(x, torch.zeros(shape, device=x.device))",
    "return self._helper(x, 3)",
    "out = cuda_extension.op_with_two_outputs(x)\nreturn cuda_extension.add(out[0], out[1])",
    "outs = [cuda_extension.op(x, k) for k in range(3)]\nfor out in outs:\n    cuda_extension.op(out)\nreturn outs",
    "def inner(t: 'Batch'):\n    return cuda_extension.op(t)\nreturn inner(x)",  # a quoted annotation
]


@pytest.mark.parametrize("body", ALLOWED_FORWARDS)
def test_allowed_forward_bodies_pass(body: str, clean_workdir: Path) -> None:
    (clean_workdir / "model_new.py").write_text(FORWARD_TEMPLATE.format(body=textwrap.indent(body, " " * 8)))
    assert [str(v) for v in policy.check_workdir(clean_workdir)] == []


FORBIDDEN_FORWARDS = [
    ("return x.sum()", {"MN004"}),
    ("return cuda_extension.op(x).view(-1)", {"MN004"}),
    ("return getattr(x, 'view')(-1)", {"MN004"}),
    ("return x.T", {"MN004"}),
    ("return super().forward(x)", {"MN004"}),
    ("return self.fc.forward(x)", {"MN004"}),
    ("self.register_forward_hook(lambda m, i, o: o)\nreturn x", {"MN004"}),
    ("return -x", {"MN005"}),
    ("return x * 2", {"MN005"}),
    ("return x @ self.weight", {"MN005"}),
    ("y = cuda_extension.op(x)\ny += 1\nreturn y", {"MN005"}),
    ("return x > 0", {"MN005"}),
    ("if x:\n    return x\nreturn x", {"MN005"}),
    ("return max(x, 0)", {"MN005"}),
    ("return x[0]", {"MN005"}),
    ("x[0] = 1\nreturn x", {"MN005"}),
    ("for row in x:\n    cuda_extension.op(row)\nreturn x", {"MN005"}),
    ("return torch.ops.aten.mm(x, x)", {"MN003"}),
    ("torch.cuda.synchronize()\nreturn x", {"MN003"}),
    ("return eval('x')", {"MN003"}),
    ("mm = torch.matmul\nreturn mm(x, x)", {"MN003"}),
    ("import numpy as np\nreturn np.tanh(x)", {"MN003", "MN006"}),
    ("torch.set_float32_matmul_precision('high')\nreturn cuda_extension.op(x)", {"MN009"}),
    ("with contextlib.suppress(RuntimeError):\n    return cuda_extension.op(x)\nreturn x", {"MN007"}),
    ("return cuda_extension.op(x, open('cache.bin').read())", {"MN008"}),
    ("return type(x).add(x, x)", {"MN003"}),
    ("return list(map(torch.relu, [x]))", {"MN003"}),
    ("@torch.compile\ndef inner(t):\n    return cuda_extension.op(t)\nreturn inner(x)", {"MN003"}),
    ("return getattr(self, 'fc')(x)", {"MN004"}),
    ("return sum([cuda_extension.a(x), cuda_extension.b(x)])", {"MN005"}),
    ("outs = []\nouts.append(cuda_extension.a(x))\nreturn max(outs)", {"MN005"}),
    ("acc = torch.zeros_like(x)\nfor out in [cuda_extension.a(x)]:\n    acc = acc + out\nreturn acc", {"MN005"}),
    ("out = cuda_extension.op(x)\nreturn out[:, 0]", {"MN005"}),
    ("import functools\nreturn functools.reduce(cuda_extension.add, [x, x])", {"MN003"}),
]


@pytest.mark.parametrize("body, rules", FORBIDDEN_FORWARDS, ids=[b.split("\n")[0] for b, _ in FORBIDDEN_FORWARDS])
def test_forbidden_forward_bodies_are_reported(body: str, rules: set[str], clean_workdir: Path) -> None:
    (clean_workdir / "model_new.py").write_text(FORWARD_TEMPLATE.format(body=textwrap.indent(body, " " * 8)))
    violations = policy.check_workdir(clean_workdir)
    assert {v.rule for v in violations} == rules, "\n".join(map(str, violations))
    assert all(v.path == "model_new.py" and v.line >= 23 for v in violations)


@pytest.mark.parametrize("signature", [
    "self, in_features: int, out_features: int, bias: bool = False",
    "self, in_features, out_features, bias=True, extra=None",
    "self, out_features, in_features, bias=True",
    "self, in_features, out_features, *, bias=True",
    "self, *args, **kwargs",
])
def test_a_constructor_with_other_parameters_is_reported(signature: str, clean_workdir: Path) -> None:
    source = (clean_workdir / "model_new.py").read_text()
    source = source.replace("def __init__(self, in_features: int, out_features: int, bias: bool = True)",
                            f"def __init__({signature})")
    (clean_workdir / "model_new.py").write_text(source)
    # Built from Model's arguments, such a constructor may fail MN010 too; this is about MN002.
    [violation] = [v for v in policy.check_workdir(clean_workdir) if v.rule != "MN010"]
    assert violation.rule == "MN002"
    assert "Model.__init__(self, in_features, out_features, bias=True)" in violation.message


def test_replacing_forward_in_the_constructor_is_reported(clean_workdir: Path) -> None:
    source = (clean_workdir / "model_new.py").read_text()
    (clean_workdir / "model_new.py").write_text(source.replace(
        "        self.scale = math.sqrt(2.0 / math.pi)\n",
        "        self.scale = math.sqrt(2.0 / math.pi)\n        self.forward = torch.compile(self.forward)\n"))
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.rule, violation.line) == ("MN001", 25) and "self.forward is replaced" in violation.message


def test_annotations_do_not_count_in_the_constructor_signature(clean_workdir: Path) -> None:
    source = (clean_workdir / "model_new.py").read_text()
    (clean_workdir / "model_new.py").write_text(
        source.replace("in_features: int, out_features: int, bias: bool = True",
                       "in_features, out_features, bias=True"))
    assert policy.check_workdir(clean_workdir) == []


def test_a_model_new_that_does_not_parse_is_reported_at_its_line(clean_workdir: Path) -> None:
    (clean_workdir / "model_new.py").write_text("import torch\n\nclass ModelNew(:\n    pass\n")
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.rule, violation.line) == ("MN001", 3)


def test_a_model_new_subclassing_something_else_is_reported(clean_workdir: Path) -> None:
    source = (clean_workdir / "model_new.py").read_text()
    source = source.replace("class ModelNew(nn.Module):", "class ModelNew(Base):")
    source = source.replace("def _rows", "class Base(nn.Module):\n    pass\n\n\ndef _rows")
    (clean_workdir / "model_new.py").write_text(source)
    assert {v.rule for v in policy.check_workdir(clean_workdir)} == {"MN001"}


# --------------------------------------------------------------------------- kernels/ corners

def test_the_lexer_drops_comments_and_strings_and_keeps_lines() -> None:
    text = ('#include <cuda_runtime.h>  // the runtime\n'
            '#include "local.h" /* a local header */\n'
            '/* at::matmul(a, b);\n   still a comment */ int a = 1\'000\'000;\n'
            'const char* s = "at::gelu(x)"; const char* r = R"x(y.view(-1)\n)x";\n'
            'char c = \'"\'; auto t = at::relu(x);\n'
            '#include SOME_MACRO\n')
    tokens, includes = policy.lex_cpp(text)
    assert [(i.name, i.angled, i.line) for i in includes] == [
        ("cuda_runtime.h", True, 1), ("local.h", False, 2), ("", False, 8)]
    identifiers = [(t.text, t.line) for t in tokens if t.kind == "id"]
    assert ("matmul", 3) not in identifiers and ("gelu", 5) not in identifiers and ("view", 5) not in identifiers
    assert ("a", 4) in identifiers and ("relu", 7) in identifiers
    assert ("1'000'000", 4) in [(t.text, t.line) for t in tokens if t.kind == "num"]


BINDING_IDIOMS = '''\
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <vector>

#include "binding_registry.h"

extern "C" int gelu_launcher(float* y, const float* bias, long long n, int cols, float scale, int config,
                             cudaStream_t stream);

torch::Tensor gelu_forward(torch::Tensor y, c10::optional<torch::Tensor> bias, double scale) {
  TORCH_CHECK(y.device().is_cuda() && y.scalar_type() == at::kFloat, "gelu: y must be float32 CUDA");
  const c10::cuda::CUDAGuard guard(y.device());
  std::vector<int64_t> shape(y.sizes().begin(), y.sizes().end());
  shape.resize(2);
  auto out = torch::empty_like(y, y.options().dtype(torch::kFloat32));
  auto scratch = at::empty({static_cast<int64_t>(shape.size())}, torch::dtype(torch::kFloat32).device(y.device()));
  for (auto i : c10::irange(y.dim())) TORCH_CHECK(y.stride(i) >= 0, "gelu: stride ", i);
  const float* b = bias ? bias->data_ptr<float>() : nullptr;
  auto stream = at::cuda::getCurrentCUDAStream().stream();
  TORCH_CHECK(gelu_launcher(out.data_ptr<float>(), b, y.numel(), static_cast<int>(y.size(-1)),
                            static_cast<float>(scale), 0, stream) == 0, "gelu: launch failed");
  (void)scratch;
  return out;
}

REGISTER_BINDING(gelu, gelu_forward, "gelu(y, bias, scale) -> out", pybind11::arg("y"), pybind11::arg("bias"),
                 pybind11::arg("scale"));
'''


def test_the_usual_binding_idioms_are_allowed(clean_workdir: Path) -> None:
    (clean_workdir / "kernels" / "gelu_binding.cpp").write_text(BINDING_IDIOMS)
    assert [str(v) for v in policy.check_workdir(clean_workdir)] == []


@pytest.mark.parametrize("line, what", [
    ("auto z = torch::zeros({4}, y.options());", "torch::zeros"),
    ("auto z = at::native::gelu(y);", "at::native::gelu"),
    ("auto z = y.to(torch::kHalf);", ".to()"),
    ("auto z = y.sum();", ".sum()"),
    ("auto z = y.index({torch::indexing::Slice()});", "torch::indexing::Slice"),
    ("auto z = torch::nn::functional::softmax(y, 1);", "torch::nn::functional::softmax"),
    ("using at::matmul;", "at::matmul"),
    ("auto z = at::_ops::mm::call(y, y);", "at::_ops::mm::call"),
    ("auto z = y.data_ptr<float>() + ::at::cuda::blas::gemm_internal(y);", "at::cuda::blas::gemm_internal"),
])
def test_torch_operators_in_a_binding_are_reported(line: str, what: str, clean_workdir: Path) -> None:
    path = clean_workdir / "kernels" / "gelu_binding.cpp"
    path.write_text(path.read_text().replace("  cudaStream_t stream =", f"  {line}\n  cudaStream_t stream =", 1))
    violations = policy.check_workdir(clean_workdir)
    assert {(v.path, v.rule) for v in violations} == {("kernels/gelu_binding.cpp", "KC001")}
    assert any(what in v.message for v in violations), "\n".join(map(str, violations))


@pytest.mark.parametrize("line, rule, what", [
    ('pybind11::exec("import torch");', "KC006", "pybind11::exec runs Python"),
    ('pybind11::eval("1 + 1");', "KC006", "pybind11::eval"),
    ('pybind11::eval_file("patch.py");', "KC006", "pybind11::eval_file"),
    ('auto g = pybind11::globals();', "KC006", "pybind11::globals"),
    ('auto torch_module = pybind11::module_::import("torch");', "KC006", "pybind11::module_::import"),
    ('namespace py = pybind11;\n  py::exec("import torch");', "KC006", "pybind11::exec"),
    ('using namespace pybind11;\n  exec("import torch");', "KC006", "exec(...) runs Python from C++"),
    ('pybind11::setattr(pybind11::none(), "softmax", pybind11::none());', "KC006", "pybind11::setattr"),
    ('pybind11::cast(y).attr("__class__");', "KC006", ".attr(...) reaches an attribute"),
    ('PyObject_SetAttrString(nullptr, "softmax", nullptr);', "KC006", "PyObject_SetAttrString(...) calls the CPython"),
    ('Py_CompileString("x", "<string>", 0);', "KC006", "Py_CompileString"),
    ("TORCH_LIBRARY(myops, m) { }", "KC007", "TORCH_LIBRARY registers operator kernels"),
    ("TORCH_LIBRARY_FRAGMENT(aten, m) { }", "KC007", "TORCH_LIBRARY_FRAGMENT"),
    ('torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);', "KC007",
     "torch::Library registers"),
    ("auto& dispatcher = c10::Dispatcher::singleton();", "KC007", "c10::Dispatcher"),
    ('const char* who = getenv("PYTEST_CURRENT_TEST");', "KC008", "getenv(...) reads the environment"),
    ('const char* who = ::secure_getenv("HOME");', "KC008", "secure_getenv"),
    ("char** env = environ;", "KC008", "environ reads the environment"),
    ('std::ifstream cache("cache.bin");', "KC008", "std::ifstream reads"),
    ('auto p = std::filesystem::path("x");', "KC008", "std::filesystem::path reads"),
    ('int rc = system("nvidia-smi");', "KC008", "system(...)"),
    ('FILE* pipe = popen("ls", "r");', "KC008", "popen(...)"),
    ('void* lib = dlopen("libcuda.so", 0);', "KC008", "dlopen(...)"),
    ("auto later = std::async([] { return 0; });", "KC009", "std::async(...) runs code on another thread"),
    ("pthread_t t; pthread_create(&t, nullptr, nullptr, nullptr);", "KC009", "pthread_create(...)"),
    ("#pragma omp parallel for\n  for (int i = 0; i < 4; ++i) {}", "KC009", "#pragma omp starts a team"),
    ("cudaLaunchHostFunc(nullptr, nullptr, nullptr);", "KC009", "cudaLaunchHostFunc(...) runs code on another"),
])
def test_cpp_that_reaches_python_the_dispatcher_the_environment_or_threads_is_reported(
        line: str, rule: str, what: str, clean_workdir: Path) -> None:
    path = clean_workdir / "kernels" / "gelu_binding.cpp"
    path.write_text(path.read_text().replace("  cudaStream_t stream =", f"  {line}\n  cudaStream_t stream =", 1))
    violations = [v for v in policy.check_workdir(clean_workdir) if v.rule != "KC001"]
    assert {(v.path, v.rule) for v in violations} == {("kernels/gelu_binding.cpp", rule)}, "\n".join(map(str, violations))
    assert any(what in v.message for v in violations), "\n".join(map(str, violations))
    assert all(v.line >= 19 for v in violations)


@pytest.mark.parametrize("line", [
    'pybind11::gil_scoped_release release;', "auto none = pybind11::none();", "int system_count = 0;",
    "std::this_thread::yield();", 'throw std::system_error(std::error_code(), "gelu");',
    "struct Opener { void open() {} } opener;\n  opener.open();", "int threads = 256; (void)threads;",
    "auto library_version = 3; (void)library_version;",
])
def test_cpp_that_only_looks_like_reaching_out_is_allowed(line: str, clean_workdir: Path) -> None:
    path = clean_workdir / "kernels" / "gelu_binding.cpp"
    path.write_text(path.read_text().replace("  cudaStream_t stream =", f"  {line}\n  cudaStream_t stream =", 1))
    assert [str(v) for v in policy.check_workdir(clean_workdir)] == []


def test_the_fixed_binding_registry_may_read_the_module_it_defines(clean_workdir: Path) -> None:
    text = (clean_workdir / "binding_registry.h").read_text()
    assert 'm.attr("__dict__")' in text and "pybind11::getattr" in text
    assert policy.check_workdir(clean_workdir) == []


@pytest.mark.parametrize("line, operator", [
    ("auto z = y * 2;", "*"), ("auto z = y[0];", "["), ("if (y == y) {}", "=="), ("auto w = -y;", "-"),
    ("auto e = torch::empty({4}, y.options());\n  auto f = e + 1;", "+"),
])
def test_operators_on_tensors_in_a_binding_are_reported(line: str, operator: str, clean_workdir: Path) -> None:
    path = clean_workdir / "kernels" / "gelu_binding.cpp"
    path.write_text(path.read_text().replace("  cudaStream_t stream =", f"  {line}\n  cudaStream_t stream =", 1))
    [violation] = policy.check_workdir(clean_workdir)
    assert violation.rule == "KC001" and f"operator `{operator}` on the tensor" in violation.message


@pytest.mark.parametrize("line", [
    "int n = y.size(0) * 2 - y.numel();", "torch::Tensor& r = y;\n  r = y;", "if (bias) { auto b2 = *bias; (void)b2; }",
    "const int64_t total = y.numel() * y.element_size();",
])
def test_arithmetic_on_tensor_metadata_is_not_an_operator(line: str, clean_workdir: Path) -> None:
    path = clean_workdir / "kernels" / "gelu_binding.cpp"
    path.write_text(path.read_text().replace("  cudaStream_t stream =", f"  {line}\n  cudaStream_t stream =", 1))
    assert policy.check_workdir(clean_workdir) == []


@pytest.mark.parametrize("header, allowed", [
    ("cuda_fp16.h", True), ("cuda/barrier", True), ("cooperative_groups/reduce.h", True), ("mma.h", True),
    ("cublasLt.h", True), ("cudnn.h", True), ("cudnn_graph.h", True), ("pybind11/stl.h", True),
    ("c10/cuda/CUDAStream.h", True), ("unordered_map", True), ("stdint.h", True),
    ("cub/cub.cuh", False), ("thrust/sort.h", False), ("cutlass/cutlass.h", False), ("cudnn_frontend.h", False),
    ("ATen/native/cuda/Loops.cuh", False), ("torch/csrc/api/include/torch/nn.h", False),
    ("torch/csrc/utils/pybind.h", True), ("fstream", False),
    ("curand_kernel.h", False), ("flash_attn/flash_api.h", False), ("triton/runtime.h", False),
])
def test_include_allow_list(header: str, allowed: bool) -> None:
    assert cpp_checks._include_allowed(header, policy.Config())[0] is allowed


def test_allow_includes_extends_the_list() -> None:
    assert cpp_checks._include_allowed("cub/cub.cuh", policy.Config(allow_includes=("cub/",)))[0]


# --------------------------------------------------------------------------- protected files, lock, config

def test_a_workdir_without_lock_names_the_command_that_writes_it(clean_workdir: Path) -> None:
    (clean_workdir / "cudaopt.lock").unlink()
    [violation] = policy.check_workdir(clean_workdir)
    assert violation.rule == "PF002"
    assert f"cudaopt init --lock-only {clean_workdir}" in violation.message


def test_a_broken_lock_file_is_reported(clean_workdir: Path) -> None:
    (clean_workdir / "cudaopt.lock").write_text("{not json")
    assert [v.rule for v in policy.check_workdir(clean_workdir)] == ["PF002"]


def test_a_missing_utils_file_is_reported(clean_workdir: Path) -> None:
    (clean_workdir / "utils" / "profiling.py").unlink()
    [violation] = policy.check_workdir(clean_workdir)
    assert violation.rule == "PF003" and "utils/profiling.py" in violation.message


def test_an_edited_binding_registry_names_the_first_changed_line(clean_workdir: Path) -> None:
    path = clean_workdir / "binding_registry.h"
    lines = path.read_text().splitlines(keepends=True)
    lines[29] = "// patched\n"
    path.write_text("".join(lines))
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.path, violation.line, violation.rule) == ("binding_registry.h", 30, "PF001")


def test_the_lock_covers_the_workdirs_conftest_and_peers(clean_workdir: Path) -> None:
    (clean_workdir / "conftest.py").write_text("import pytest\n")
    (clean_workdir / "peers.py").write_text("PEERS = {}\n")
    assert [(v.path, v.rule) for v in policy.check_workdir(clean_workdir)] == [
        ("conftest.py", "PF003"), ("peers.py", "PF003")]
    policy.write_lock(clean_workdir)
    assert policy.check_workdir(clean_workdir) == []
    (clean_workdir / "conftest.py").write_text("def pytest_cudaopt_perf_clock(config, device): ...\n")
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.path, violation.rule) == ("conftest.py", "PF003") and "changed since" in violation.message


def test_the_lock_covers_the_cudaopt_settings_not_the_rest_of_pyproject(clean_workdir: Path) -> None:
    pyproject = clean_workdir / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n[tool.pytest.ini_options]\ncudaopt_min_speedup = "1.05"\n'
                         'addopts = "-ra"\n[tool.cudaopt]\nallow-imports = ["numpy"]\n')
    policy.write_lock(clean_workdir)
    # Reformatting, reordering and unrelated keys do not count.
    pyproject.write_text('[tool.cudaopt]\nallow-imports = [ "numpy" ]\n\n[project]\nname = "y"\n'
                         '[tool.pytest.ini_options]\naddopts = "-q"\ncudaopt_min_speedup = "1.05"\n')
    assert policy.check_workdir(clean_workdir) == []
    pyproject.write_text('[tool.pytest.ini_options]\ncudaopt_min_speedup = "0.5"\n'
                         '[tool.cudaopt]\nallow-imports = ["numpy"]\ndisable = ["PF003", "MN003"]\n')
    messages = sorted(v.message.split(";")[0] for v in policy.check_workdir(clean_workdir))
    assert messages == [
        "setting pyproject.toml [tool.cudaopt] disable was added after the workdir was locked",
        "setting pyproject.toml [tool.pytest.ini_options] cudaopt_min_speedup changed since it was "
        "recorded in cudaopt.lock"]
    (clean_workdir / "pytest.ini").write_text("[pytest]\ncudaopt_atol = 1\n")
    assert any(v.path == "pytest.ini" and "cudaopt_atol was added" in v.message
               for v in policy.check_workdir(clean_workdir))


def test_disable_skips_a_rule(clean_workdir: Path) -> None:
    (clean_workdir / "cudaopt.lock").unlink()
    (clean_workdir / "pyproject.toml").write_text('[tool.cudaopt]\ndisable = ["PF002"]\n')
    assert policy.check_workdir(clean_workdir) == []


@pytest.mark.parametrize("table, message", [
    ('disable = "KC005"', "must be a list of strings"),
    ('disable = ["KC999"]', "unknown rule ids ['KC999']"),
    ("allow-everything = []", "unknown key 'allow-everything'"),
])
def test_a_bad_configuration_is_reported(table: str, message: str, clean_workdir: Path) -> None:
    (clean_workdir / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n[tool.cudaopt]\n{table}\n')
    policy.write_lock(clean_workdir)
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.path, violation.line, violation.rule) == ("pyproject.toml", 4, "CF001")
    assert message in violation.message


def test_without_a_toml_reader_the_configuration_is_skipped_with_a_warning(clean_workdir: Path, monkeypatch) -> None:
    (clean_workdir / "pyproject.toml").write_text('[tool.cudaopt]\ndisable = ["MN005"]\n')
    monkeypatch.setattr(rules, "load_toml", lambda path: None)
    with pytest.warns(UserWarning, match="strict default rules apply"):
        config = policy.load_config(clean_workdir)
    assert config == policy.Config()


# --------------------------------------------------------------------------- ModelNew's construction (MN010)

def _add_to_constructor(workdir: Path, lines: str) -> None:
    path = workdir / "model_new.py"
    anchor = "        self.scale = math.sqrt(2.0 / math.pi)\n"
    path.write_text(path.read_text().replace(anchor, anchor + textwrap.indent(lines, " " * 8)))


def test_a_constructor_may_store_extension_functions_but_not_call_them_without_a_build(clean_workdir: Path) -> None:
    _add_to_constructor(clean_workdir, "self.op = cuda_extension.gelu\nself.table = cuda_extension.make_table(4)\n")
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.path, violation.line, violation.rule) == ("model_new.py", 26, "MN010")
    assert violation.message == (
        "ModelNew(*get_init_inputs()) fails on the CPU: ExtensionNotBuilt: cuda_extension.make_table() was called "
        "while the workdir has no build of cuda_extension; ModelNew's constructor and model_new.py's import must "
        "not call the extension (it is checked without one), or build it first (`cudaopt build`) (in __init__: "
        "`self.table = cuda_extension.make_table(4)`)")


def test_with_a_build_the_constructor_runs_with_the_real_extension(clean_workdir: Path) -> None:
    _add_to_constructor(clean_workdir, "self.table = cuda_extension.make_table(4)\n")
    built = types.SimpleNamespace(make_table=lambda n: list(range(n)))
    assert policy.check_workdir(clean_workdir, extension=built) == []


def test_cudaopt_check_constructs_with_the_last_build_on_disk(tmp_path: Path, make_workdir, capsys) -> None:
    """MN010 runs in a worker with the build on disk (the stand-in without one): a constructor
    that calls the extension passes only where there is a build."""
    from support import copy_workdir

    call = "        self.probe = cuda_extension.scale(torch.ones(1, 2), torch.ones(2), torch.zeros(2))\n"
    for dest, built in ((tmp_path / "unbuilt", False), (tmp_path / "built", True)):
        path = make_workdir("cpu_scale", dest=dest) if built else copy_workdir("cpu_scale", dest)
        source = (path / "model_new.py").read_text()
        marker = "        super().__init__()\n"
        (path / "model_new.py").write_text(source.replace(marker, marker + call, 1))
        code = cli.main(["check", str(path)])
        out = capsys.readouterr().out
        if built:
            assert "MN010" not in out and "EX001 not checked" not in out, out  # PF002: no lock in a copy
        else:
            assert code == 1 and "MN010: ModelNew(*get_init_inputs()) fails on the CPU: ExtensionNotBuilt" in out, out


def test_a_helper_that_fails_names_its_own_line_and_the_constructor_line_that_called_it(clean_workdir: Path) -> None:
    path = clean_workdir / "model_new.py"
    path.write_text(path.read_text().replace(
        "        self.scale = math.sqrt(2.0 / math.pi)\n",
        "        self.scale = self._scale(2.0)\n\n    def _scale(self, x):\n        return math.sqrt(x / self.pi)\n"))
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.path, violation.line) == ("model_new.py", 27)
    assert violation.message == ("ModelNew(*get_init_inputs()) fails on the CPU: AttributeError: 'ModelNew' object "
                                 "has no attribute 'pi' (in _scale: `return math.sqrt(x / self.pi)`; called from "
                                 "model_new.py:24 in __init__)")


def test_a_constructor_that_exits_is_a_finding_not_the_end_of_the_check(clean_workdir: Path) -> None:
    _add_to_constructor(clean_workdir, "raise SystemExit(3)\n")
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.line, violation.message) == (
        25, "ModelNew(*get_init_inputs()) fails on the CPU: SystemExit: 3 (in __init__: `raise SystemExit(3)`)")


def test_parameters_of_other_shapes_are_reported(clean_workdir: Path) -> None:
    path = clean_workdir / "model_new.py"
    path.write_text(path.read_text().replace("nn.Linear(in_features, out_features, bias=bias)",
                                             "nn.Linear(out_features, in_features, bias=bias)"))
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.line, violation.rule) == (19, "MN010")
    assert violation.message.endswith("other shapes: fc.weight (80, 96) in Model, (96, 80) in ModelNew, "
                                      "fc.bias (80,) in Model, (96,) in ModelNew")


def test_a_broken_get_init_inputs_is_reported_in_model_py(clean_workdir: Path) -> None:
    path = clean_workdir / "model.py"
    path.write_text(path.read_text().replace("    return [in_features, out_features]",
                                             "    return [in_features, out_features // 0]"))
    policy.write_lock(clean_workdir)
    [violation] = policy.check_workdir(clean_workdir)
    assert (violation.path, violation.line, violation.rule) == ("model.py", 28, "MN010")
    assert violation.message.startswith("get_init_inputs() failed, so ModelNew cannot be constructed: "
                                        "ZeroDivisionError: integer division or modulo by zero")


def test_a_constructor_that_needs_real_values_is_built_on_the_cpu() -> None:
    import torch
    from pytest_cudaopt.candidate import construct

    class Plain(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.fc = torch.nn.Linear(n, n)

    class ReadsValues(Plain):
        def __init__(self, n):
            super().__init__(int(torch.linspace(0, n, 3)[1].item()))  # .item() fails on the meta device

    assert construct.build_model(Plain, [4]).fc.weight.device.type == "meta"  # no memory filled
    assert construct.build_model(ReadsValues, [4]).fc.weight.shape == (2, 2)


def test_the_construction_check_leaves_the_process_as_it_was(tmp_path: Path) -> None:
    import torch
    from pytest_cudaopt.workdir import module_prefix

    workdir = assemble("mn006_other_workdir", tmp_path / "wd")
    path, state = list(sys.path), torch.get_rng_state()
    assert "MN010" in {v.rule for v in policy.check_workdir(workdir)}
    assert sys.path == path and torch.equal(torch.get_rng_state(), state)
    assert not [name for name in sys.modules if name.startswith(module_prefix(workdir)) or name == "cuda_extension"]


def test_disabling_mn010_skips_the_construction(tmp_path: Path) -> None:
    workdir = assemble("mn010_missing_class_attribute", tmp_path / "wd")
    assert policy.check_workdir(workdir, policy.Config(disable=frozenset({"MN010"}))) == []


def test_pytest_m_policy_fails_the_construction_item_with_its_line(pytester: pytest.Pytester, run_pytest) -> None:
    assemble("mn010_missing_class_attribute", pytester.path / "wd")
    result = run_pytest(pytester, "-m", "policy", "wd/model_new.py")
    result.assert_outcomes(passed=len(policy.RULE_IDS) - 1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*MN010: model_new.py imports and `ModelNew(*get_init_inputs())` constructs*",
                                 "wd/model_new.py:12: MN010: ModelNew(*get_init_inputs()) fails on the CPU: "
                                 "AttributeError: 'ModelNew' object has no attribute '_make_fc' (in __init__: *"])


# --------------------------------------------------------------------------- front doors

def test_render_prints_path_line_rule_message_relative_to_the_current_folder(tmp_path, monkeypatch) -> None:
    workdir = assemble("mn005_matmul_operator", tmp_path / "wd")
    monkeypatch.chdir(workdir)
    text = policy.render(policy.check_workdir(workdir), workdir)
    assert re.match(r"model_new\.py:16: MN005: operator `@` on a tensor dispatches a torch op", text)
    assert text.splitlines()[-1].startswith("cudaopt check: 1 violation(s) of MN005")


def test_cudaopt_check_exits_zero_on_a_clean_workdir(clean_workdir: Path, capsys) -> None:
    assert cli.main(["check", str(clean_workdir)]) == 0
    assert (f"follows all {len(policy.RULES)} rules; EX001 not checked: no build yet (`cudaopt build`)"
            in capsys.readouterr().out)
    assert len(policy.RULES) == 27


def test_cudaopt_check_counts_the_rules_the_pytest_items_check(make_workdir, pytester, run_pytest, capsys) -> None:
    workdir = make_workdir("cpu_scale", dest=pytester.path / "wd")  # built: EX001 is checked too
    policy.write_lock(workdir)
    assert cli.main(["check", str(workdir)]) == 0
    assert f"follows all {policy.rule_count()} rules" in capsys.readouterr().out
    result = run_pytest(pytester, "wd", "-m", "policy", "--collect-only", "-q")
    items = [line for line in result.outlines if line.startswith("wd/model_new.py::TestPolicy::")]
    assert len(items) == policy.rule_count() == 28


def test_cudaopt_check_ends_a_constructor_that_never_returns_at_cudaopt_timeout(tmp_path: Path) -> None:
    """MN010 runs the workdir's code; `cudaopt check` gives it cudaopt_timeout, as the pytest item has."""
    workdir = assemble("clean", tmp_path / "wd")
    source = (workdir / "model_new.py").read_text()
    marker = "        super().__init__()\n"
    # one line: the interrupt may land on the loop's test or its body, and both must name it
    (workdir / "model_new.py").write_text(source.replace(marker, marker + "        while True: pass\n", 1))
    line = source[:source.index(marker)].count("\n") + 2
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "CUDAOPT_TIMEOUT": "3"}
    done = run_python(["-m", "pytest_cudaopt.cli", "check", str(workdir)], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"wd/model_new.py:{line}: MN010: model_new.py's import and ModelNew(*get_init_inputs()) did not end " \
           "within cudaopt_timeout=3s" in done.stdout, done.stdout


def test_cudaopt_check_exits_non_zero_and_prints_json(tmp_path: Path, capsys) -> None:
    workdir = assemble("kc001_tensor_method", tmp_path / "wd")
    assert cli.main(["check", "--json", str(workdir)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False and report["workdir"] == str(workdir)
    assert report["violations"] == [{"rule": "KC001", "path": "kernels/gelu_binding.cpp", "line": 13,
                                     "message": report["violations"][0]["message"]}]
    assert set(report["rules"]) == set(policy.RULE_IDS)


def test_cudaopt_check_as_a_process_exits_one_on_a_violation(tmp_path: Path) -> None:
    workdir = assemble("kd001_version_file", tmp_path / "wd")
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
    done = run_python(["-m", "pytest_cudaopt.cli", "check", str(workdir)], cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "wd/kernels/gelu_v2.cu:1: KD001:" in done.stdout


def test_pytest_m_policy_runs_one_item_per_rule(pytester: pytest.Pytester, run_pytest) -> None:
    assemble("clean", pytester.path / "wd")
    result = run_pytest(pytester, "-m", "policy", "wd/model_new.py", "-v")
    # test_extension_functions skips: no build of the extension yet.
    result.assert_outcomes(passed=len(policy.RULE_IDS), skipped=1)
    result.stdout.fnmatch_lines(["*model_new.py::TestPolicy::test_rule?MN001? PASSED*",
                                 "*model_new.py::TestPolicy::test_rule?CF001? PASSED*"])


def test_pytest_m_policy_fails_the_broken_rule_with_its_lines_and_skips_disabled_ones(
        pytester: pytest.Pytester, run_pytest) -> None:
    workdir = assemble("mn005_matmul_operator", pytester.path / "wd")
    (workdir / "cudaopt.lock").unlink()
    (workdir / "pyproject.toml").write_text('[tool.cudaopt]\ndisable = ["PF002"]\n')
    result = run_pytest(pytester, "-m", "policy", "wd/model_new.py")
    result.assert_outcomes(passed=len(policy.RULE_IDS) - 2, failed=1, skipped=2)
    result.stdout.fnmatch_lines(["*MN005: the forward path applies no Python operator to a tensor*",
                                 "wd/model_new.py:16: MN005: operator `@` on a tensor*"])


# --------------------------------------------------------------------------- this repository

@pytest.mark.parametrize("name", [*policy.PROTECTED_TEMPLATES, "utils/__init__.py", "utils/verification.py",
                                  "utils/profiling.py", "utils/compile.sh"])
def test_the_shipped_templates_are_the_files_of_the_top_level_workdir(name: str) -> None:
    assert filecmp.cmp(REPO_ROOT / name, policy.TEMPLATES / name, shallow=False)


def test_the_top_level_workdir_follows_the_rules() -> None:
    violations = policy.check_workdir(REPO_ROOT)
    assert not violations, policy.render(violations, REPO_ROOT)
