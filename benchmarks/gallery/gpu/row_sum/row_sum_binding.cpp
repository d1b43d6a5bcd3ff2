// row_sum_binding.cpp: cuda_extension.row_sum(x): checks, allocation, launch.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t row_sum_launcher(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream);

namespace {

at::Tensor row_sum_forward(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "row_sum: x must be float32; got ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), "row_sum: x must be contiguous; got strides ", x.strides());
  TORCH_CHECK(x.is_cuda(), "row_sum: x must be a CUDA tensor; got device ", x.device());
  TORCH_CHECK(x.dim() == 2, "row_sum: x must have shape (rows, cols); got ", x.sizes());
  at::Tensor y = torch::empty({x.size(0)}, x.options());
  cudaError_t status = row_sum_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
                                        c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(status == cudaSuccess, "row_sum: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

void register_row_sum(pybind11::module& m) {
  m.def("row_sum", &row_sum_forward, "row_sum(x) -> y: y[r] = sum of row r of x (rows, cols); float32, contiguous, CUDA.",
        pybind11::arg("x"));
}

REGISTER_BINDING(row_sum, register_row_sum);
