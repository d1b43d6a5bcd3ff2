// softmax_binding.cpp: cuda_extension.softmax(x) -> softmax over dim 1 of a (rows, cols) float32 tensor.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t softmax_launcher(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream);

namespace {

at::Tensor softmax_forward(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "softmax: x must be a contiguous float32 CUDA tensor; got dtype ",
              x.scalar_type());
  TORCH_CHECK(x.dim() == 2, "softmax: x must have shape (rows, cols); got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(), "softmax: x must be contiguous; got strides ", x.strides());
  TORCH_CHECK(x.is_cuda(), "softmax: x must be on a CUDA device; got ", x.device());
  at::Tensor y = torch::empty_like(x);
  cudaError_t status = softmax_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
                                        c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(status == cudaSuccess, "softmax: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

void register_softmax(pybind11::module& m) {
  m.def("softmax", &softmax_forward, "softmax(x) -> y: softmax over dim 1 of a contiguous float32 (rows, cols) "
        "CUDA tensor", pybind11::arg("x"));
}

REGISTER_BINDING(softmax, register_softmax);
