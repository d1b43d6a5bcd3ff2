// conv_binding.cpp: conv(x, weight, y) writes the 1-D convolution of x (N, W) into y (float32, CUDA).
#include <ATen/cuda/CUDAContext.h>
#include <cudnn.h>
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" int conv_launcher(cudnnHandle_t handle, const float* x, const float* w, float* y, int n,
                             int width, void* workspace, size_t workspace_bytes);

void conv_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor y, int64_t handle_address) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2, "conv: x must be a 2-D CUDA tensor, got ", x.sizes());
  auto handle = reinterpret_cast<cudnnHandle_t>(handle_address);
  int status = conv_launcher(handle, x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(),
                             static_cast<int>(x.size(0)), static_cast<int>(x.size(1)), nullptr, 0);
  TORCH_CHECK(status == 0, "conv: cuDNN status ", status);
}

void register_conv(pybind11::module& m) {
  m.def("conv", &conv_forward, "conv(x, weight, y, handle): 1-D convolution (float32)",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("y"), pybind11::arg("handle"));
}

REGISTER_BINDING(conv, register_conv);
