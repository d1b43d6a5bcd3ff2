// attention.h: the launcher of kernels/attention.cu, shared with its binding (no torch here).
#pragma once

#include <cuda_runtime.h>

// Tile-shape variants the launcher's `config` selects among (see attention.cu): 0 is the default.
constexpr int kAttentionConfigs = 11;

// y (B, T, C) = causal softmax(q k^T / sqrt(D)) v per head, q|k|v read from qkv (B, T, 3C),
// C = H * D. Returns the launch status (cudaErrorInvalidValue for bad sizes or config).
extern "C" cudaError_t attention_launcher(const float* qkv, float* y, int B, int T, int H, int D,
                                          int config, cudaStream_t stream);
