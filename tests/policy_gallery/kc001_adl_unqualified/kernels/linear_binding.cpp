// linear_binding.cpp: linear(x, weight, y, rows) writes x weight^T into y (float32, contiguous, CUDA).
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" int linear_launcher(cublasHandle_t handle, const float* x, const float* w, float* y, int rows,
                               int in_features, int out_features);

void linear_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor y, int64_t rows) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda() && y.is_cuda(), "linear: x, weight and y must be CUDA tensors");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "linear: x and weight must be contiguous");
  const int64_t in_features = weight.size(1), out_features = weight.size(0);
  TORCH_CHECK(x.size(-1) == in_features, "linear: x last dimension ", x.size(-1), " != weight.size(1) ",
              in_features);
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  torch::Tensor reference = mm(x, weight);  // EXPECT: KC001
  int status = linear_launcher(handle, x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(),
                               static_cast<int>(rows), static_cast<int>(in_features), static_cast<int>(out_features));
  TORCH_CHECK(status == 0, "linear: cuBLAS status ", status);
}

void register_linear(pybind11::module& m) {
  m.def("linear", &linear_forward, "linear(x, weight, y, rows): y = x weight^T",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("y"), pybind11::arg("rows"));
}

REGISTER_BINDING(linear, register_linear);
