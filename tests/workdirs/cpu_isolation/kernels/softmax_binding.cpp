// softmax_binding.cpp: the isolation workdir's bindings. `softmax` is honest; `sigmoid` computes the
// wrong function; `patch_torch_softmax` and `override_aten_softmax` make the reference compute it
// too, through Python run from C++ and through the operator dispatcher, when model_new.py asks;
// the TORCH_LIBRARY_IMPL below does it when the extension is imported, in a process whose
// environment asks (tests/exploits/ plants them; KC006-KC008 refuse them all).
#include <ATen/core/Tensor.h>
#include <pybind11/eval.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <cstdlib>

#include "binding_registry.h"

extern "C" void isolation_softmax_f32(const float* x, float* y, int64_t rows, int64_t cols);
extern "C" void isolation_sigmoid_f32(const float* x, float* y, int64_t n);
extern "C" void isolation_sigmoid_f64(const double* x, double* y, int64_t n);

namespace {

void check(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() >= 1 && x.numel() > 0,
              "isolation: x must be a non-empty contiguous CPU tensor; got ", x.sizes());
}

at::Tensor row_softmax(const at::Tensor& x) {
  check(x);
  TORCH_CHECK(x.scalar_type() == at::kFloat, "isolation: softmax takes float32");
  at::Tensor y = torch::empty_like(x);
  isolation_softmax_f32(x.data_ptr<float>(), y.data_ptr<float>(), x.numel() / x.size(-1), x.size(-1));
  return y;
}

at::Tensor row_sigmoid(const at::Tensor& x) {
  check(x);
  at::Tensor y = torch::empty_like(x);
  if (x.scalar_type() == at::kDouble) {
    isolation_sigmoid_f64(x.data_ptr<double>(), y.data_ptr<double>(), x.numel());
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "isolation: sigmoid takes float32 or float64");
    isolation_sigmoid_f32(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  }
  return y;
}

// A kernel for aten::_softmax(Tensor self, int dim, bool half_to_float) that computes a sigmoid.
at::Tensor sigmoid_as_softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  (void)dim;
  (void)half_to_float;
  return row_sigmoid(self);
}

// torch.softmax becomes a sigmoid for every caller in the process, the reference included.
void patch_torch_softmax() {
  pybind11::exec("import torch\ntorch.softmax = lambda t, dim=-1, *a, **k: torch.sigmoid(t)");
}

// aten::_softmax on the CPU becomes a sigmoid (the reference, its float64 run, eager and compiled
// baselines dispatch to it); registered when called, kept for the life of the process.
void override_aten_softmax() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
  static bool done = false;
  if (!done) {
    library->impl("_softmax", TORCH_FN(sigmoid_as_softmax));
    done = true;
  }
}

}  // namespace

// At the extension's import: aten::_softmax on the CPU becomes a sigmoid for the whole process.
TORCH_LIBRARY_IMPL(aten, CPU, m) {
  if (std::getenv("CUDAOPT_ISOLATION_OVERRIDE_AT_IMPORT") != nullptr) m.impl("_softmax", TORCH_FN(sigmoid_as_softmax));
}

void register_isolation(pybind11::module& m) {
  m.def("softmax", &row_softmax, "softmax(x) -> y: softmax over the last dimension (float32, CPU)", pybind11::arg("x"));
  m.def("sigmoid", &row_sigmoid, "sigmoid(x) -> y: the wrong function", pybind11::arg("x"));
  m.def("patch_torch_softmax", &patch_torch_softmax, "torch.softmax = a sigmoid, from C++");
  m.def("override_aten_softmax", &override_aten_softmax, "aten::_softmax on the CPU = a sigmoid");
}

REGISTER_BINDING(isolation, register_isolation);
