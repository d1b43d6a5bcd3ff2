// row_sum.cu (honest): y[r] = sum_c x[r, c]. One read per element (4 bytes): 2048 x 8192 moves
// 67 MB, 16 us at ~4.3 TB/s. One block per row: strided partial sums, warp shuffles, then the
// warps' sums through shared memory.
#include <cuda_runtime.h>

#include <cstdint>

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void row_sum_kernel0(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float sum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) sum += row[c];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kWarps];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = threadIdx.x < kWarps ? warp_sums[threadIdx.x] : 0.f;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) y[blockIdx.x] = sum;
  }
}

extern "C" cudaError_t row_sum_launcher(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  row_sum_kernel0<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, y, cols);
  return cudaGetLastError();
}
