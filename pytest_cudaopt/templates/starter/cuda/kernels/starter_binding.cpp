// starter_binding.cpp: cuda_extension.starter(x, config=0) -> y = x: checks, allocation, launch.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t starter_launcher(const float* x, float* y, int64_t n, int config, cudaStream_t stream);

namespace {

at::Tensor starter(const at::Tensor& x, int64_t config) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "starter: x must be a contiguous float32 CUDA tensor; got dtype ",
              x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), "starter: x must be a contiguous float32 CUDA tensor; got strides ", x.strides(),
              " for shape ", x.sizes());
  TORCH_CHECK(x.is_cuda(), "starter: x must be a contiguous float32 CUDA tensor; got device ", x.device());
  at::Tensor y = torch::empty_like(x);
  const cudaError_t status = starter_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                                              static_cast<int>(config),
                                              c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(status != cudaErrorInvalidValue || config == 0, "starter: unknown config ", config,
              " (0: one thread per element)");
  TORCH_CHECK(status == cudaSuccess, "starter: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

void register_starter(pybind11::module& m) {
  m.def("starter", &starter, "starter(x, config=0) -> y: a copy of x (float32, contiguous, CUDA), element by element",
        pybind11::arg("x"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(starter, register_starter);
