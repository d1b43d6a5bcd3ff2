// attention.h: the launcher of kernels/attention.cu, shared with its binding (no torch here).
#pragma once

#include <cuda_runtime.h>

// What the launcher's `config` selects (see attention.cu).
constexpr int kAttentionTensorCore = 0;  // the default: 3xTF32 on wgmma (warp-specialised) for D = 64 on
                                         // an sm_90a image, on mma.sync for D in {32, 64, 96, 128} elsewhere
constexpr int kAttentionGeneric = 1;     // one warp per query row, any head size (the fallback)
constexpr int kAttentionMmaSync = 2;     // 3xTF32 on mma.sync only (config 0 before wgmma)
constexpr int kAttentionConfigs = 3;

// y (B, T, C) = causal softmax(q k^T / sqrt(D)) v per head, q|k|v read from qkv (B, T, 3C),
// C = H * D. Returns the launch status (cudaErrorInvalidValue for bad sizes or config).
extern "C" cudaError_t attention_launcher(const float* qkv, float* y, int B, int T, int H, int D,
                                          int config, cudaStream_t stream);
