// leaky_relu.cu (wrong): the slope applied ten times over, y = x > 0 ? x : 10 * slope * x. One read and one write
// per element (8 bytes): 4096 x 4096 moves 134 MB, 31 us at the H200's ~4.3 TB/s.
// float4 loads and stores in a grid-stride loop where both pointers are 16-byte aligned.
#include <cuda_runtime.h>

#include <cstdint>

constexpr int kThreads = 256;
constexpr int kBlocks = 132 * 8;   // a few waves of the H200's 132 SMs

__device__ __forceinline__ float leaky(float v, float slope) { return v > 0.f ? v : 10.f * slope * v; }

__global__ void leaky_relu_kernel0(const float* __restrict__ x, float* __restrict__ y, int64_t n, float slope) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t quads = n / 4;
  for (int64_t i = first; i < quads; i += stride) {
    float4 v = reinterpret_cast<const float4*>(x)[i];
    v.x = leaky(v.x, slope); v.y = leaky(v.y, slope); v.z = leaky(v.z, slope); v.w = leaky(v.w, slope);
    reinterpret_cast<float4*>(y)[i] = v;
  }
  for (int64_t i = quads * 4 + first; i < n; i += stride) y[i] = leaky(x[i], slope);
}

__global__ void leaky_relu_kernel1(const float* __restrict__ x, float* __restrict__ y, int64_t n, float slope) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = leaky(x[i], slope);
}

extern "C" cudaError_t leaky_relu_launcher(const float* x, float* y, int64_t n, float slope, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % 16 == 0;
  const int64_t wanted = ((aligned ? n / 4 : n) + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < kBlocks ? (wanted > 0 ? wanted : 1) : kBlocks);
  if (aligned) {
    leaky_relu_kernel0<<<blocks, kThreads, 0, stream>>>(x, y, n, slope);
  } else {
    leaky_relu_kernel1<<<blocks, kThreads, 0, stream>>>(x, y, n, slope);
  }
  return cudaGetLastError();
}
