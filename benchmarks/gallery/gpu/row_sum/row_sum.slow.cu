// row_sum.cu (slow): correct, but one thread per row adds its row alone (no coalescing).
#include <cuda_runtime.h>

#include <cstdint>

__global__ void row_sum_kernel0(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float sum = 0.f;
  for (int64_t c = 0; c < cols; ++c) sum += x[r * cols + c];
  y[r] = sum;
}

extern "C" cudaError_t row_sum_launcher(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  row_sum_kernel0<<<static_cast<unsigned>((rows + 31) / 32), 32, 0, stream>>>(x, y, rows, cols);
  return cudaGetLastError();
}
