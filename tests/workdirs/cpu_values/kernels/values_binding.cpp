// values_binding.cpp: cuda_extension.softmax, mse and their planted variants for the cpu_values
// example workdir: checks, allocation, the call.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" {
void softmax_launcher(const float* x, float* y, int64_t rows, int64_t cols);
void softmax_no_max_launcher(const float* x, float* y, int64_t rows, int64_t cols);
void mse_launcher(const float* p, const float* t, float* out, int64_t n, int64_t stride);
}

namespace {

constexpr int64_t kStrideFrom = int64_t(1) << 20;  // the planted subsample starts at 2^20 elements
constexpr int64_t kStride = 64;

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), "values: ", name,
              " must be a contiguous float32 CPU tensor");
}

at::Tensor softmax_with(void (*launcher)(const float*, float*, int64_t, int64_t), const at::Tensor& x) {
  check(x, "x");
  TORCH_CHECK(x.dim() == 2, "softmax: x must be (rows, cols), got ", x.sizes());
  at::Tensor y = torch::empty_like(x);
  launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1));
  return y;
}

at::Tensor softmax(const at::Tensor& x) { return softmax_with(softmax_launcher, x); }
at::Tensor softmax_no_max(const at::Tensor& x) { return softmax_with(softmax_no_max_launcher, x); }

at::Tensor mse_with(const at::Tensor& p, const at::Tensor& t, int64_t stride) {
  check(p, "predictions");
  check(t, "targets");
  TORCH_CHECK(p.sizes() == t.sizes(), "mse: predictions and targets must have one shape");
  at::Tensor out = torch::empty({}, p.options());
  mse_launcher(p.data_ptr<float>(), t.data_ptr<float>(), out.data_ptr<float>(), p.numel(), stride);
  return out;
}

at::Tensor mse(const at::Tensor& p, const at::Tensor& t) { return mse_with(p, t, 1); }
// Planted: every 64th element once the inputs are large (exact on small ones).
at::Tensor mse_strided(const at::Tensor& p, const at::Tensor& t) {
  return mse_with(p, t, p.numel() >= kStrideFrom ? kStride : 1);
}

}  // namespace

void register_values(pybind11::module& m) {
  m.def("softmax", &softmax, "softmax(x) over the rows of a (rows, cols) x, the row max subtracted",
        pybind11::arg("x"));
  m.def("softmax_no_max", &softmax_no_max, "exp(x) / sum(exp(x)) without the row max", pybind11::arg("x"));
  m.def("mse", &mse, "mean((predictions - targets)^2) over every element", pybind11::arg("predictions"),
        pybind11::arg("targets"));
  m.def("mse_strided", &mse_strided, "the same over every 64th element from 2^20 elements on",
        pybind11::arg("predictions"), pybind11::arg("targets"));
}

REGISTER_BINDING(values, register_values);
