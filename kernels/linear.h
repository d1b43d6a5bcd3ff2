// linear.h: the cuBLASLt entry points of kernels/linear.cpp, shared with its binding (no torch here).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// y (M, N) = x (M, K) W^T + b, row-major float32; W is (N, K), b is (N). fp32 compute (no TF32),
// bias fused as the epilogue. `handle` and `workspace` are the caller's (the binding passes
// torch's per-device cuBLASLt handle and workspace); `device` keys the descriptor cache.
extern "C" cublasStatus_t linear_launcher(cublasLtHandle_t handle, const float* x, const float* weight,
                                          const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                                          void* workspace, size_t workspace_bytes, int device,
                                          cudaStream_t stream);

// Text of a status that linear_launcher returned.
extern "C" const char* linear_status_string(cublasStatus_t status);
