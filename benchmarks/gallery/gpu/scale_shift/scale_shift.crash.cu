// scale_shift.cu (crash): writes far past the end of y, an illegal address that ends the CUDA context. One read and one write per
// element (8 bytes; weight and bias stay in cache): 4096 x 2048 moves 67 MB, 16 us at ~4.3 TB/s.
#include <cuda_runtime.h>

#include <cstdint>

constexpr int kThreads = 256;

__global__ void scale_shift_kernel0(const float* __restrict__ x, const float* __restrict__ weight,
                                    const float* __restrict__ bias, float* __restrict__ y, int64_t n,
                                    int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const int64_t f = i % features;
    y[i + (int64_t{1} << 40)] = x[i] * weight[f] + bias[f];
  }
}

extern "C" cudaError_t scale_shift_launcher(const float* x, const float* weight, const float* bias, float* y,
                                            int64_t rows, int64_t features, cudaStream_t stream) {
  const int64_t n = rows * features;
  if (n == 0) return cudaSuccess;
  scale_shift_kernel0<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      x, weight, bias, y, n, features);
  return cudaGetLastError();
}
