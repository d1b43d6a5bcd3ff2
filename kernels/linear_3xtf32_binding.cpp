// linear_3xtf32_binding.cpp: Python entry of nn.Linear forward: the 3xTF32 wgmma GEMM of
// kernels/linear_3xtf32.cu where it runs (Hopper, an sm_90a build, in/out_features multiples of
// 4), cuBLASLt's fp32 SGEMM (kernels/linear.cpp, via linear_binding.cpp) everywhere else.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "../binding_registry.h"
#include "linear_3xtf32.h"
#include "linear_args.h"

// Defined in linear_binding.cpp.
void run_linear_cublaslt(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const LinearProblem& p);

namespace {

// config: 0 the 3xTF32 GEMM's default variant where it runs, else cuBLASLt; 1 cuBLASLt's fp32
// SGEMM always (the fallback path, selectable for tests); 2, 3, ... the GEMM's other variants
// (the launcher's configs 1, 2, ...; see linear_3xtf32.cu).
constexpr int kLinearCublasLt = 1;
constexpr int kLinearConfigs = kLinear3xTf32Configs + 1;

int launcher_config(int64_t config) { return config == 0 ? 0 : static_cast<int>(config) - 1; }

LinearProblem prepare(const char* op, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      int64_t config) {
  TORCH_CHECK(config >= 0 && config < kLinearConfigs, op, ": config must be in [0, ", kLinearConfigs, "), got ",
              config);
  return prepare_linear(op, x, weight, bias);
}

bool runs_3xtf32(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const LinearProblem& p,
                 int64_t config, cudaStream_t stream) {
  return config != kLinearCublasLt && p.M > 0 && p.N > 0 &&
         linear_3xtf32_supported(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                 p.y.data_ptr<float>(), p.M, p.N, p.K, stream) == 1;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t config) {
  LinearProblem p = prepare("linear", x, weight, bias, config);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  if (!runs_3xtf32(x, weight, bias, p, config, stream)) {
    run_linear_cublaslt(x, weight, bias, p);
    return p.y;
  }
  at::Tensor w_split = torch::empty({2 * p.N, p.K}, weight.options());  // W's tf32 high and low parts
  const cudaError_t err =
      linear_3xtf32_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                             p.y.data_ptr<float>(), w_split.data_ptr<float>(), p.M, p.N, p.K,
                             launcher_config(config), stream);
  TORCH_CHECK(err == cudaSuccess, "linear: 3xTF32 GEMM launch failed for x ", x.sizes(), " and weight ",
              weight.sizes(), " (config ", config, "): ", cudaGetErrorString(err));
  return p.y;
}

// The path linear(x, weight, bias, config) takes for these tensors.
std::string linear_path(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t config) {
  LinearProblem p = prepare("linear_path", x, weight, bias, config);
  if (p.M == 0 || p.N == 0) return "none";
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device()).stream();
  return runs_3xtf32(x, weight, bias, p, config, stream) ? "3xtf32" : "cublaslt";
}

}  // namespace

void register_linear(pybind11::module& m) {
  m.def("linear", &linear,
        "linear(x, weight, bias, config=0) -> y: nn.Linear forward, y = x @ weight.T + bias, at float32\n"
        "accuracy. x (..., in_features), weight (out_features, in_features), bias (out_features,):\n"
        "float32, contiguous, one CUDA device. y (..., out_features). config 0: the 3xTF32 wgmma GEMM\n"
        "on Hopper where in/out_features are multiples of 4, else cuBLASLt fp32; 1: cuBLASLt fp32\n"
        "always; 2+: the GEMM's other variants (kernels/linear_3xtf32.cu).",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("config") = 0);
  m.def("linear_path", &linear_path,
        "linear_path(x, weight, bias, config=0) -> '3xtf32' | 'cublaslt' | 'none': the path linear()\n"
        "takes for these tensors on this device.",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(linear, register_linear);
