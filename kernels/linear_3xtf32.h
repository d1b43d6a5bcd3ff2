// linear_3xtf32.h: the 3xTF32 wgmma GEMM of kernels/linear_3xtf32.cu, shared with its binding.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// Tile-shape variants of the launcher's `config` (see linear_3xtf32.cu).
constexpr int kLinear3xTf32Configs = 4;

// 1 where linear_3xtf32_launcher can run this problem on the current device (Hopper with an
// sm_90a image, K and N multiples of 4, aligned pointers), else 0. The first call per device
// runs a one-int probe kernel on `stream` and synchronises it.
extern "C" int linear_3xtf32_supported(const float* x, const float* weight, const float* bias, const float* y,
                                       int64_t M, int64_t N, int64_t K, cudaStream_t stream);

// y (M, N) = x (M, K) W^T + b at float32 accuracy on the tensor cores (3xTF32). `w_split` is
// scratch for 2 * N * K floats (W's tf32 high and low parts, written here). Returns
// cudaErrorNotSupported where linear_3xtf32_supported says no.
extern "C" cudaError_t linear_3xtf32_launcher(const float* x, const float* weight, const float* bias, float* y,
                                              float* w_split, int64_t M, int64_t N, int64_t K, int config,
                                              cudaStream_t stream);
