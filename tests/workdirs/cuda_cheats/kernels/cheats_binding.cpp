// cheats_binding.cpp: cuda_extension.scale(x, weight, bias, config=0): checks, allocation, launch of
// kernels/cheats.cu's correct kernel (config 0) or one of its cheats (configs 1..5).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t cheats_launcher(const float* x, const float* weight, const float* bias, float* y,
                                       int64_t rows, int64_t features, int config, cudaStream_t stream);

namespace {

void check_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.is_cuda(), "cheats: ", name,
              " must be a contiguous float32 CUDA tensor; got ", t.scalar_type(), " of shape ", t.sizes(),
              " on ", t.device());
}

at::Tensor cheat_scale(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t config) {
  check_tensor(x, "x");
  check_tensor(weight, "weight");
  check_tensor(bias, "bias");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1) && bias.sizes() == weight.sizes(),
              "cheats: x must be (batch, features), weight and bias (features,); got ", x.sizes(), ", ",
              weight.sizes(), ", ", bias.sizes());
  TORCH_CHECK(weight.device() == x.device() && bias.device() == x.device(),
              "cheats: weight and bias must be on x's device ", x.device());
  TORCH_CHECK(config >= 0 && config <= 5, "cheats: config must be in [0, 5], got ", config);
  at::Tensor y = torch::empty_like(x);
  // The launch's own error only: a fault of the kernel surfaces at the next synchronising call
  // (or here, when the kernel has already faulted).
  const cudaError_t err = cheats_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                          y.data_ptr<float>(), x.size(0), x.size(1), static_cast<int>(config),
                                          c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "cheats: kernel launch failed for x ", x.sizes(), ", config ", config, ": ",
              cudaGetErrorString(err));
  return y;
}

}  // namespace

void register_scale(pybind11::module& m) {
  m.def("scale", &cheat_scale,
        "scale(x, weight, bias, config=0) -> y = x * weight + bias for x (batch, features), float32, "
        "contiguous, CUDA. config 0 is correct; 1 leaves each row's last element unwritten, 2 writes "
        "out of bounds, 3 differs by one ulp every second call, 4 runs on an unjoined side stream, "
        "5 runs on an unjoined side stream without the busy work.",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(scale, register_scale);
