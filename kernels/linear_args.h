// linear_args.h: the argument checks and output allocation shared by the nn.Linear bindings
// (linear_binding.cpp, linear_3xtf32_binding.cpp); messages name the op, the tensor and its shape.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include <vector>

#include "checks.h"

// y (M, N) = x (M, K) W^T + b, x's leading dimensions flattened into M; y allocated here.
struct LinearProblem {
  int64_t M, N, K;
  at::Tensor y;
};

inline LinearProblem prepare_linear(const char* op, const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias) {
  check_cuda_float32_contiguous(x, op, "x");
  check_cuda_float32_contiguous(weight, op, "weight");
  check_cuda_float32_contiguous(bias, op, "bias");
  check_same_device(x, "x", weight, "weight", op);
  check_same_device(x, "x", bias, "bias", op);
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be 2-D (out_features, in_features), got shape ",
              weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == N, op, ": bias must have shape (", N,
              ",) to match weight's out_features, got ", bias.sizes());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, op, ": x must have last dimension in_features = ", K,
              ", got shape ", x.sizes());
  // x's device is current under the caller's device guard; checked so that a mismatch is an
  // error, not a launch on the wrong device.
  TORCH_CHECK(x.get_device() == c10::cuda::current_device(), op, ": x is on cuda:", x.get_device(),
              " but the current device is cuda:", c10::cuda::current_device(),
              " (call under torch.cuda.device(x.device))");
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  const int64_t M = K > 0 ? x.numel() / K : 0;
  TORCH_CHECK(K > 0 || M == 0, op, ": in_features must be positive, got weight shape ", weight.sizes());
  return {M, N, K, torch::empty(out_shape, x.options())};
}
