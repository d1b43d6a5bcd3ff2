// mse_binding.cpp: cuda_extension.mse(p, t, stride=1, config=0) -> mean((p - t)^2) over every stride-th element,
// a 0-dim float32 CUDA tensor.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "../binding_registry.h"

extern "C" int mse_blocks(int config);
extern "C" cudaError_t mse_launcher(const float* p, const float* t, float* out, double* partial, int64_t n,
                                    int64_t stride, int config, cudaStream_t stream);

namespace {

at::Tensor mse(const at::Tensor& p, const at::Tensor& t, int64_t stride, int64_t config) {
  TORCH_CHECK(p.is_cuda() && p.scalar_type() == at::kFloat && p.is_contiguous(),
              "mse: predictions must be a contiguous float32 CUDA tensor, got ", p.scalar_type(), " ", p.sizes());
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.sizes() == p.sizes(),
              "mse: targets must be a contiguous float32 CUDA tensor of predictions' shape ", p.sizes(), ", got ",
              t.scalar_type(), " ", t.sizes());
  const int blocks = mse_blocks(static_cast<int>(config));
  TORCH_CHECK(blocks > 0, "mse: unknown config ", config);
  TORCH_CHECK(p.numel() > 0 && stride > 0, "mse: needs elements and a positive stride, got ", p.sizes(), ", ", stride);
  at::Tensor out = torch::empty({}, p.options());
  at::Tensor partial = torch::empty({blocks}, p.options().dtype(at::kDouble));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(p.get_device()).stream();
  const cudaError_t err = mse_launcher(p.data_ptr<float>(), t.data_ptr<float>(), out.data_ptr<float>(),
                                       partial.data_ptr<double>(), p.numel(), stride, static_cast<int>(config), stream);
  TORCH_CHECK(err == cudaSuccess, "mse: launch failed for ", p.sizes(), ": ", cudaGetErrorString(err));
  return out;
}

}  // namespace

void register_mse(pybind11::module& m) {
  m.def("mse", &mse, "mse(predictions, targets, stride=1, config=0) -> mean((p - t)^2) over every stride-th element",
        pybind11::arg("predictions"), pybind11::arg("targets"), pybind11::arg("stride") = 1,
        pybind11::arg("config") = 0);
}

REGISTER_BINDING(mse, register_mse);
