// leaky_relu_binding.cpp: cuda_extension.leaky_relu(x, negative_slope): checks, allocation, launch.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t leaky_relu_launcher(const float* x, float* y, int64_t n, float slope, cudaStream_t stream);

namespace {

at::Tensor leaky_relu_forward(const at::Tensor& x, double negative_slope) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "leaky_relu: x must be float32; got ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), "leaky_relu: x must be contiguous; got strides ", x.strides());
  TORCH_CHECK(x.is_cuda(), "leaky_relu: x must be a CUDA tensor; got device ", x.device());
  at::Tensor y = torch::empty_like(x);
  cudaError_t status = leaky_relu_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                                           static_cast<float>(negative_slope),
                                           c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(status == cudaSuccess, "leaky_relu: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

void register_leaky_relu(pybind11::module& m) {
  m.def("leaky_relu", &leaky_relu_forward,
        "leaky_relu(x, negative_slope) -> y: x where x > 0, else negative_slope * x; x float32, contiguous, CUDA.",
        pybind11::arg("x"), pybind11::arg("negative_slope"));
}

REGISTER_BINDING(leaky_relu, register_leaky_relu);
