// linear_binding.cpp: Python entry of kernels/linear.cpp (nn.Linear forward on cuBLASLt).
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "../binding_registry.h"
#include "checks.h"
#include "linear.h"

namespace {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_cuda_float32_contiguous(x, "linear", "x");
  check_cuda_float32_contiguous(weight, "linear", "weight");
  check_cuda_float32_contiguous(bias, "linear", "bias");
  check_same_device(x, "x", weight, "weight", "linear");
  check_same_device(x, "x", bias, "bias", "linear");
  TORCH_CHECK(weight.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape ",
              weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == N, "linear: bias must have shape (", N,
              ",) to match weight's out_features, got ", bias.sizes());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "linear: x must have last dimension in_features = ", K,
              ", got shape ", x.sizes());
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = torch::empty(out_shape, x.options());
  const int64_t M = K > 0 ? x.numel() / K : 0;
  if (M == 0 || N == 0 || K == 0) {
    TORCH_CHECK(K > 0 || M == 0, "linear: in_features must be positive, got weight shape ", weight.sizes());
    return y;
  }
  // torch's cuBLASLt handle and workspace for the current device and stream (x's device is current
  // under the caller's device guard; checked so a mismatch is an error, not a wrong-device launch).
  const int device = x.get_device();
  TORCH_CHECK(device == c10::cuda::current_device(), "linear: x is on cuda:", device,
              " but the current device is cuda:", c10::cuda::current_device(),
              " (call under torch.cuda.device(x.device))");
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const cublasStatus_t status = linear_launcher(
      at::cuda::getCurrentCUDABlasLtHandle(), x.data_ptr<float>(), weight.data_ptr<float>(),
      bias.data_ptr<float>(), y.data_ptr<float>(), M, N, K, at::cuda::getCUDABlasLtWorkspace(),
      at::cuda::getCUDABlasLtWorkspaceSize(), device, stream);
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "linear: cuBLASLt matmul failed for x ", x.sizes(),
              " and weight ", weight.sizes(), ": ", linear_status_string(status));
  return y;
}

}  // namespace

void register_linear(pybind11::module& m) {
  m.def("linear", &linear,
        "linear(x, weight, bias) -> y: nn.Linear forward, y = x @ weight.T + bias.\n"
        "x (..., in_features), weight (out_features, in_features), bias (out_features,):\n"
        "float32, contiguous, one CUDA device. y (..., out_features). fp32 cuBLASLt, no TF32.",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"));
}

REGISTER_BINDING(linear, register_linear);
