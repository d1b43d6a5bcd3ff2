// scale_binding.cpp: cuda_extension.scale(x, weight, bias, config=0): checks, allocation, launch.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t scale_launcher(const float* x, const float* weight, const float* bias, float* y,
                                      int64_t rows, int64_t features, int config, cudaStream_t stream);

namespace {

// Every tensor argument: float32, contiguous, on the GPU; dtype and layout are checked
// before the device so that each rule can be tested on a machine without a GPU.
void check_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "scale: ", name,
              " must be a contiguous float32 CUDA tensor; got dtype ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "scale: ", name, " must be a contiguous float32 CUDA tensor; got strides ",
              t.strides(), " for shape ", t.sizes());
  TORCH_CHECK(t.is_cuda(), "scale: ", name, " must be a contiguous float32 CUDA tensor; got device ",
              t.device());
}

at::Tensor scale_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t config) {
  check_tensor(x, "x");
  check_tensor(weight, "weight");
  check_tensor(bias, "bias");
  TORCH_CHECK(x.dim() == 2, "scale: x must have shape (batch, features); got ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), "scale: weight must have shape (",
              x.size(1), ",) to match x's features; got ", weight.sizes());
  TORCH_CHECK(bias.sizes() == weight.sizes(), "scale: bias must have shape (", x.size(1), ",); got ", bias.sizes());
  TORCH_CHECK(weight.device() == x.device() && bias.device() == x.device(),
              "scale: weight and bias must be on x's device ", x.device());
  at::Tensor y = torch::empty_like(x);
  cudaError_t status = scale_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                      y.data_ptr<float>(), x.size(0), x.size(1), static_cast<int>(config),
                                      c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(status != cudaErrorInvalidValue || config == 0, "scale: unknown config ", config, " (0: one thread per element)");
  TORCH_CHECK(status == cudaSuccess, "scale: kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace

void register_scale(pybind11::module& m) {
  m.def("scale", &scale_forward,
        "scale(x, weight, bias, config=0) -> y: y = x * weight + bias for x of shape "
        "(batch, features) and weight, bias of shape (features,); all float32, contiguous, CUDA.",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(scale, register_scale);
