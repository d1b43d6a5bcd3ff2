// masked_cumsum_binding.cpp: cuda_extension.masked_cumsum(x, mask, dim, config=0) -> cumsum(x * mask, dim) on the CPU.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" int masked_cumsum_launcher(const float* x, const bool* mask, float* y, int64_t outer, int64_t n,
                                      int64_t inner, int config);

namespace {

at::Tensor masked_cumsum(const at::Tensor& x, const at::Tensor& mask, int64_t dim, int64_t config) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "masked_cumsum: x must be a contiguous float32 CPU tensor; got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.is_contiguous() && mask.sizes() == x.sizes(),
              "masked_cumsum: mask must be a contiguous bool tensor of x's shape ", x.sizes(), "; got ",
              mask.scalar_type(), " ", mask.sizes());
  TORCH_CHECK(x.dim() > 0, "masked_cumsum: x must have a dimension to sum along");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TORCH_CHECK(d >= 0 && d < x.dim(), "masked_cumsum: dim ", dim, " out of range for x of ", x.dim(), " dims");
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  at::Tensor y = torch::empty_like(x);
  const int status = masked_cumsum_launcher(x.data_ptr<float>(), mask.data_ptr<bool>(), y.data_ptr<float>(), outer,
                                            x.size(d), inner, static_cast<int>(config));
  TORCH_CHECK(status == 0, "masked_cumsum: unknown config ", config, " (0: lanes side by side)");
  return y;
}

}  // namespace

void register_masked_cumsum(pybind11::module& m) {
  m.def("masked_cumsum", &masked_cumsum, "masked_cumsum(x, mask, dim, config=0) -> cumsum(x * mask, dim)",
        pybind11::arg("x"), pybind11::arg("mask"), pybind11::arg("dim"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(masked_cumsum, register_masked_cumsum);
