// mse.cu: mean((p - t)^2) over n float32 elements, or over every `stride`-th one. Each thread sums its squares in
// double over a grid-stride loop (float4 loads where the stride is 1), blocks reduce by warp shuffles into one double
// partial each; a second kernel sums the partials in a fixed order and writes the float32 mean.
#include <cuda_runtime.h>
#include <cstdint>

namespace {

constexpr int kThreads = 256;

__device__ double block_sum(double v) {
  __shared__ double warps[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : 0.0;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

__global__ void partial_sums(const float* __restrict__ p, const float* __restrict__ t, int64_t n, int64_t stride,
                             double* __restrict__ partial) {
  double acc = 0.0;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const bool vec = stride == 1 && (reinterpret_cast<uintptr_t>(p) % 16 == 0) && (reinterpret_cast<uintptr_t>(t) % 16 == 0);
  if (vec) {
    const int64_t n4 = n / 4;
    const float4* p4 = reinterpret_cast<const float4*>(p);
    const float4* t4 = reinterpret_cast<const float4*>(t);
    for (int64_t i = first; i < n4; i += step) {
      const float4 a = p4[i], b = t4[i];
      const float dx = a.x - b.x, dy = a.y - b.y, dz = a.z - b.z, dw = a.w - b.w;
      acc += static_cast<double>(dx * dx + dy * dy) + static_cast<double>(dz * dz + dw * dw);
    }
    for (int64_t i = n4 * 4 + first; i < n; i += step) {
      const float d = p[i] - t[i];
      acc += static_cast<double>(d * d);
    }
  } else {
    for (int64_t i = first * stride; i < n; i += step * stride) {
      const float d = p[i] - t[i];
      acc += static_cast<double>(d * d);
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void finish(const double* __restrict__ partial, int blocks, double count, float* __restrict__ out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = static_cast<float>(acc / count);
}

}  // namespace

extern "C" int mse_blocks(int config) { return config == 0 ? 132 * 8 : -1; }

extern "C" cudaError_t mse_launcher(const float* p, const float* t, float* out, double* partial, int64_t n,
                                    int64_t stride, int config, cudaStream_t stream) {
  const int blocks = mse_blocks(config);
  if (blocks <= 0 || n <= 0 || stride <= 0) return cudaErrorInvalidValue;
  partial_sums<<<blocks, kThreads, 0, stream>>>(p, t, n, stride, partial);
  const double count = static_cast<double>((n + stride - 1) / stride);
  finish<<<1, kThreads, 0, stream>>>(partial, blocks, count, out);
  return cudaGetLastError();
}
