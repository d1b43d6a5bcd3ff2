// memsafety_binding.cpp: cuda_extension.scale(x, weight, bias, config=0): checks, allocation, launch of
// kernels/memsafety.cu's correct kernel (config 0) or one with a memory fault (configs 1..3).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" cudaError_t memsafety_launcher(const float* x, const float* weight, const float* bias,
                                          const float* scratch, float* y, int64_t rows, int64_t features,
                                          int config, cudaStream_t stream);

namespace {

void check_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.is_cuda(), "memsafety: ", name,
              " must be a contiguous float32 CUDA tensor; got ", t.scalar_type(), " of shape ", t.sizes(),
              " on ", t.device());
}

at::Tensor scale(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t config) {
  check_tensor(x, "x");
  check_tensor(weight, "weight");
  check_tensor(bias, "bias");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1) && bias.sizes() == weight.sizes(),
              "memsafety: x must be (batch, features), weight and bias (features,); got ", x.sizes(), ", ",
              weight.sizes(), ", ", bias.sizes());
  TORCH_CHECK(config >= 0 && config <= 3, "memsafety: config must be in [0, 3], got ", config);
  at::Tensor y = torch::empty_like(x);
  at::Tensor scratch = torch::empty_like(x);  // config 3 reads it unwritten
  const cudaError_t err = memsafety_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                             scratch.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
                                             static_cast<int>(config),
                                             c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "memsafety: kernel launch failed for x ", x.sizes(), ", config ", config, ": ",
              cudaGetErrorString(err));
  return y;
}

}  // namespace

void register_scale(pybind11::module& m) {
  m.def("scale", &scale,
        "scale(x, weight, bias, config=0) -> y = x * weight + bias for x (batch, features), float32, "
        "contiguous, CUDA. config 0 is correct; 1 also writes one float past y, 2 races on shared memory, "
        "3 reads uninitialised global memory (the outputs stay right).",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(scale, register_scale);
