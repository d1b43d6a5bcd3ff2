// starter_binding.cpp: cuda_extension.starter(x, config=0) -> y = x on the CPU: checks, allocation, the call.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" int starter_launcher(const float* x, float* y, int64_t n, int config);

namespace {

at::Tensor starter(const at::Tensor& x, int64_t config) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "starter: x must be a contiguous float32 CPU tensor; got dtype ",
              x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), "starter: x must be a contiguous float32 CPU tensor; got strides ", x.strides(),
              " for shape ", x.sizes());
  TORCH_CHECK(x.device().is_cpu(), "starter: x must be a contiguous float32 CPU tensor; got device ", x.device());
  at::Tensor y = torch::empty_like(x);
  const int status = starter_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), static_cast<int>(config));
  TORCH_CHECK(status == 0, "starter: unknown config ", config, " (0: one pass)");
  return y;
}

}  // namespace

void register_starter(pybind11::module& m) {
  m.def("starter", &starter, "starter(x, config=0) -> y: a copy of x (float32, contiguous, CPU), element by element",
        pybind11::arg("x"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(starter, register_starter);
