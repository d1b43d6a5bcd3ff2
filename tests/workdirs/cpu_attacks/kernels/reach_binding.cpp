// reach_binding.cpp: wipe_bias and slow_add_bias (kernels/reach.cpp) on contiguous float32 CPU tensors.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" int64_t reach_wipe_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols,
                                       int64_t pid);
extern "C" bool reach_slow_add_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols);

namespace {

void check(const at::Tensor& x, const at::Tensor& b) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() == 2 && x.scalar_type() == at::kFloat,
              "reach: x must be a contiguous 2-D float32 CPU tensor; got ", x.sizes());
  TORCH_CHECK(b.is_contiguous() && b.dim() == 1 && b.size(0) == x.size(1) && b.scalar_type() == at::kFloat,
              "reach: b must be float32 of shape (", x.size(1), "); got ", b.sizes());
}

at::Tensor wipe_bias(const at::Tensor& x, const at::Tensor& b, int64_t pid) {
  check(x, b);
  at::Tensor y = torch::empty_like(x);
  reach_wipe_bias_f32(x.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1), pid);
  return y;
}

at::Tensor slow_add_bias(const at::Tensor& x, const at::Tensor& b) {
  check(x, b);
  at::Tensor y = torch::empty_like(x);
  TORCH_CHECK(reach_slow_add_bias_f32(x.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), x.size(0),
                                      x.size(1)),
              "slow_add_bias: the clock could not be detoured");
  return y;
}

void register_reach(pybind11::module& m) {
  m.def("wipe_bias", &wipe_bias, "y = x, after zeroing every copy of b in the memory of this process or of pid");
  m.def("slow_add_bias", &slow_add_bias, "y = x + b in 10 ms that perf_counter does not see");
}

}  // namespace

REGISTER_BINDING(reach, register_reach);
