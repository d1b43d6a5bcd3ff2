// gelu_binding.cpp: cuda_extension.gelu(x): checks, allocation, launch.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t gelu_launcher(const float* x, float* y, int64_t n, cudaStream_t stream);

namespace {

at::Tensor gelu_forward(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "gelu: x must be float32; got ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), "gelu: x must be contiguous; got strides ", x.strides());
  TORCH_CHECK(x.is_cuda(), "gelu: x must be a CUDA tensor; got device ", x.device());
  at::Tensor y = torch::empty_like(x);
  cudaError_t status = gelu_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                                     c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(status == cudaSuccess, "gelu: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

void register_gelu(pybind11::module& m) {
  m.def("gelu", &gelu_forward,
        "gelu(x) -> y: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); x float32, contiguous, CUDA.",
        pybind11::arg("x"));
}

REGISTER_BINDING(gelu, register_gelu);
