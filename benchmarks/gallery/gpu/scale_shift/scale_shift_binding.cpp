// scale_shift_binding.cpp: cuda_extension.scale_shift(x, weight, bias): checks, allocation, launch.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t scale_shift_launcher(const float* x, const float* weight, const float* bias, float* y,
                                            int64_t rows, int64_t features, cudaStream_t stream);

namespace {

void check_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "scale_shift: ", name, " must be float32; got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "scale_shift: ", name, " must be contiguous; got strides ", t.strides());
  TORCH_CHECK(t.is_cuda(), "scale_shift: ", name, " must be a CUDA tensor; got device ", t.device());
}

at::Tensor scale_shift_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_tensor(x, "x");
  check_tensor(weight, "weight");
  check_tensor(bias, "bias");
  TORCH_CHECK(x.dim() == 2, "scale_shift: x must have shape (batch, features); got ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && bias.sizes() == weight.sizes(),
              "scale_shift: weight and bias must have shape (", x.size(1), ",); got ", weight.sizes(), " and ",
              bias.sizes());
  at::Tensor y = torch::empty_like(x);
  cudaError_t status = scale_shift_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                            y.data_ptr<float>(), x.size(0), x.size(1),
                                            c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(status == cudaSuccess, "scale_shift: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

void register_scale_shift(pybind11::module& m) {
  m.def("scale_shift", &scale_shift_forward,
        "scale_shift(x, weight, bias) -> y = x * weight + bias for x (batch, features), weight and bias (features,); "
        "float32, contiguous, CUDA.",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"));
}

REGISTER_BINDING(scale_shift, register_scale_shift);
