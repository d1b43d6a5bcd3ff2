// linear.h: the cuBLASLt entry points of kernels/linear.cpp, shared with its binding (no torch here).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// Workspace the binding hands to cuBLASLt (what cuBLAS itself uses on Hopper).
constexpr size_t kLinearWorkspaceBytes = 32u << 20;

// y (M, N) = x (M, K) W^T + b, row-major float32; W is (N, K), b is (N). fp32 compute (no TF32),
// bias fused as the epilogue. `device` picks the per-device handle; `stream` orders the work.
extern "C" cublasStatus_t linear_launcher(const float* x, const float* weight, const float* bias,
                                          float* y, int64_t M, int64_t N, int64_t K, void* workspace,
                                          size_t workspace_bytes, int device, cudaStream_t stream);

// Text of a status that linear_launcher returned.
extern "C" const char* linear_status_string(cublasStatus_t status);
