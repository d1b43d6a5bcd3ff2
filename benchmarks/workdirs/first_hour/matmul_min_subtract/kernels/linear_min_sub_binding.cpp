// linear_min_sub_binding.cpp: cuda_extension.linear_min_sub(x, w, b, c, config=0) -> min(x w^T + b, c) - c on the CPU.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" int linear_min_sub_launcher(const float* x, const float* w, const float* b, const float* c, float* y,
                                       int64_t M, int64_t K, int64_t N, int config);

namespace {

void check(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu() && t.dim() == dims,
              "linear_min_sub: ", name, " must be a contiguous float32 CPU tensor of ", dims, " dims; got ",
              t.scalar_type(), " ", t.sizes());
}

at::Tensor linear_min_sub(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& c,
                          int64_t config) {
  check(x, "x", 2);
  check(w, "weight", 2);
  check(b, "bias", 1);
  check(c, "constant", 0);
  TORCH_CHECK(w.size(1) == x.size(1) && b.size(0) == w.size(0), "linear_min_sub: x ", x.sizes(), ", weight ",
              w.sizes(), " and bias ", b.sizes(), " do not agree");
  at::Tensor y = torch::empty({x.size(0), w.size(0)}, x.options());
  const int status = linear_min_sub_launcher(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                             c.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
                                             w.size(0), static_cast<int>(config));
  TORCH_CHECK(status == 0, "linear_min_sub: unknown config ", config, " (0: blocked)");
  return y;
}

}  // namespace

void register_linear_min_sub(pybind11::module& m) {
  m.def("linear_min_sub", &linear_min_sub,
        "linear_min_sub(x, w, b, c, config=0) -> min(x w^T + b, c) - c; x [M, K], w [N, K], b [N], c scalar",
        pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("b"), pybind11::arg("c"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(linear_min_sub, register_linear_min_sub);
