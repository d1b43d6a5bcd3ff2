// scale_binding.cpp: cuda_extension.scale(x, weight, bias, config=0): checks, allocation, launch.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" int scale_launcher(const float* x, const float* weight, const float* bias, float* y,
                              int64_t rows, int64_t features, int config);

namespace {

// Every tensor argument: float32, contiguous, on the CPU; the message names it.
void check_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "scale: ", name, " must be a contiguous float32 CPU tensor; got dtype ",
              t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "scale: ", name, " must be a contiguous float32 CPU tensor; got strides ",
              t.strides(), " for shape ", t.sizes());
  TORCH_CHECK(t.device().is_cpu(), "scale: ", name, " must be a contiguous float32 CPU tensor; got device ",
              t.device());
}

at::Tensor scale_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t config) {
  check_tensor(x, "x");
  check_tensor(weight, "weight");
  check_tensor(bias, "bias");
  TORCH_CHECK(x.dim() == 2, "scale: x must have shape (batch, features); got ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), "scale: weight must have shape (",
              x.size(1), ",) to match x's features; got ", weight.sizes());
  TORCH_CHECK(bias.sizes() == weight.sizes(), "scale: bias must have shape (", x.size(1), ",); got ", bias.sizes());
  at::Tensor y = torch::empty_like(x);
  int status = scale_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                              y.data_ptr<float>(), x.size(0), x.size(1), static_cast<int>(config));
  TORCH_CHECK(status == 0, "scale: unknown config ", config, " (0: by rows, 1: by columns)");
  return y;
}

}  // namespace

void register_scale(pybind11::module& m) {
  m.def("scale", &scale_forward,
        "scale(x, weight, bias, config=0) -> y: y = x * weight + bias for x of shape "
        "(batch, features) and weight, bias of shape (features,); all float32, contiguous, CPU.",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(scale, register_scale);
