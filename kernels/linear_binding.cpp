// linear_binding.cpp: Python entry of kernels/linear.cpp, nn.Linear forward on cuBLASLt's fp32
// SGEMM (the path linear() of linear_3xtf32_binding.cpp falls back to, and linear_fp32()).
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>

#include "../binding_registry.h"
#include "linear.h"
#include "linear_args.h"

// y = x W^T + b on cuBLASLt (fp32 compute, no TF32) into p.y; shared with linear_3xtf32_binding.cpp.
void run_linear_cublaslt(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const LinearProblem& p) {
  if (p.M == 0 || p.N == 0) return;
  const int device = x.get_device();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  // torch's cuBLASLt handle and workspace for the current device and stream.
  const cublasStatus_t status = linear_launcher(
      at::cuda::getCurrentCUDABlasLtHandle(), x.data_ptr<float>(), weight.data_ptr<float>(),
      bias.data_ptr<float>(), p.y.data_ptr<float>(), p.M, p.N, p.K, at::cuda::getCUDABlasLtWorkspace(),
      at::cuda::getCUDABlasLtWorkspaceSize(), device, stream);
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "linear: cuBLASLt matmul failed for x ", x.sizes(),
              " and weight ", weight.sizes(), ": ", linear_status_string(status));
}

namespace {

at::Tensor linear_fp32(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  LinearProblem p = prepare_linear("linear_fp32", x, weight, bias);
  run_linear_cublaslt(x, weight, bias, p);
  return p.y;
}

}  // namespace

void register_linear_fp32(pybind11::module& m) {
  m.def("linear_fp32", &linear_fp32,
        "linear_fp32(x, weight, bias) -> y: nn.Linear forward, y = x @ weight.T + bias, on cuBLASLt's\n"
        "fp32 SGEMM (no TF32). x (..., in_features), weight (out_features, in_features), bias\n"
        "(out_features,): float32, contiguous, one CUDA device. y (..., out_features).",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"));
}

REGISTER_BINDING(linear_fp32, register_linear_fp32);
