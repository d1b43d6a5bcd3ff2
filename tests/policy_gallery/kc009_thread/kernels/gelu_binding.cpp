// gelu_binding.cpp: gelu(y, bias, scale) -> y: tanh GELU of y + bias, in place (float32, contiguous, CUDA).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include <thread>

#include "binding_registry.h"

extern "C" int gelu_launcher(float* y, const float* bias, long long n, int cols, float scale, int config,
                             cudaStream_t stream);

torch::Tensor gelu_forward(torch::Tensor y, c10::optional<torch::Tensor> bias, double scale) {
  TORCH_CHECK(y.is_cuda(), "gelu: y must be a CUDA tensor");
  TORCH_CHECK(y.scalar_type() == torch::kFloat32, "gelu: y must be float32, got ", y.scalar_type());
  TORCH_CHECK(y.is_contiguous(), "gelu: y must be contiguous");
  const int cols = static_cast<int>(y.size(-1));
  const float* b = nullptr;
  if (bias) {
    TORCH_CHECK(bias->numel() == cols, "gelu: bias must have ", cols, " elements, got ", bias->numel());
    b = bias->data_ptr<float>();
  }
  std::thread worker([] {});  // EXPECT: KC009
  worker.join();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  int status = gelu_launcher(y.data_ptr<float>(), b, y.numel(), cols, static_cast<float>(scale), 0, stream);
  TORCH_CHECK(status == 0, "gelu: launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(status)));
  return y;
}

void register_gelu(pybind11::module& m) {
  m.def("gelu", &gelu_forward, "gelu(y, bias, scale) -> y: tanh GELU of y + bias in place (float32)",
        pybind11::arg("y"), pybind11::arg("bias"), pybind11::arg("scale"));
}

REGISTER_BINDING(gelu, register_gelu);
