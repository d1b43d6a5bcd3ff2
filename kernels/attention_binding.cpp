// attention_binding.cpp: Python entry of kernels/attention.cu (causal self-attention core).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "../binding_registry.h"
#include "attention.h"
#include "checks.h"

namespace {

at::Tensor causal_attention(const at::Tensor& qkv, int64_t n_head, int64_t config) {
  check_cuda_float32_contiguous(qkv, "causal_attention", "qkv");
  TORCH_CHECK(qkv.dim() == 3, "causal_attention: qkv must be 3-D (B, T, 3C), got shape ", qkv.sizes());
  const int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2);
  TORCH_CHECK(C3 % 3 == 0, "causal_attention: qkv's last dimension must be 3C (q | k | v), got ", C3);
  const int64_t C = C3 / 3;
  TORCH_CHECK(n_head > 0 && C > 0 && C % n_head == 0, "causal_attention: n_head must be positive and divide C = ",
              C, ", got n_head = ", n_head);
  TORCH_CHECK(config >= 0 && config < kAttentionConfigs, "causal_attention: config must be in [0, ",
              kAttentionConfigs, "), got ", config);
  TORCH_CHECK(B <= INT32_MAX && T <= INT32_MAX && C3 <= INT32_MAX,
              "causal_attention: each qkv dimension must fit in int32, got shape ", qkv.sizes());
  at::Tensor y = torch::empty({B, T, C}, qkv.options());
  if (B == 0 || T == 0) return y;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(qkv.get_device()).stream();
  const cudaError_t err = attention_launcher(qkv.data_ptr<float>(), y.data_ptr<float>(), static_cast<int>(B),
                                             static_cast<int>(T), static_cast<int>(n_head),
                                             static_cast<int>(C / n_head), static_cast<int>(config), stream);
  TORCH_CHECK(err == cudaSuccess, "causal_attention: kernel launch failed for qkv ", qkv.sizes(),
              ", n_head ", n_head, ", config ", config, ": ", cudaGetErrorString(err));
  return y;
}

}  // namespace

void register_causal_attention(pybind11::module& m) {
  m.def("causal_attention", &causal_attention,
        "causal_attention(qkv, n_head, config=0) -> y: causal self-attention per head.\n"
        "qkv (B, T, 3C): the c_attn output [q | k | v], float32, contiguous, CUDA; n_head divides C,\n"
        "head size D = C / n_head (any D; D in {32, 64, 96, 128} run on the tensor cores).\n"
        "y (B, T, C): heads merged, softmax(q k^T / sqrt(D), causal) v. config 0 = tensor cores\n"
        "(the default: wgmma for D = 64 on an sm_90a build, mma.sync otherwise), 1 = the generic path\n"
        "for any head size, 2 = mma.sync only (see kernels/attention.cu).",
        pybind11::arg("qkv"), pybind11::arg("n_head"), pybind11::arg("config") = 0);
}

REGISTER_BINDING(causal_attention, register_causal_attention);
