// bias_binding.cpp: add_bias and drop_bias on contiguous float32 CPU tensors.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" void attack_add_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols);
extern "C" void attack_drop_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols);

namespace {

using Kernel = void (*)(const float*, const float*, float*, int64_t, int64_t);

at::Tensor apply(const at::Tensor& x, const at::Tensor& b, Kernel kernel) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() == 2 && x.scalar_type() == at::kFloat,
              "bias: x must be a contiguous 2-D float32 CPU tensor; got ", x.sizes());
  TORCH_CHECK(b.is_contiguous() && b.dim() == 1 && b.size(0) == x.size(1) && b.scalar_type() == at::kFloat,
              "bias: b must be float32 of shape (", x.size(1), "); got ", b.sizes());
  at::Tensor y = torch::empty_like(x);
  kernel(x.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1));
  return y;
}

at::Tensor add_bias(const at::Tensor& x, const at::Tensor& b) { return apply(x, b, attack_add_bias_f32); }
at::Tensor drop_bias(const at::Tensor& x, const at::Tensor& b) { return apply(x, b, attack_drop_bias_f32); }

void register_bias(pybind11::module& m) {
  m.def("add_bias", &add_bias, "y = x + b (x: (rows, cols) float32, b: (cols,))");
  m.def("drop_bias", &drop_bias, "y = x, b ignored (wrong on purpose)");
}

}  // namespace

REGISTER_BINDING(bias, register_bias);
