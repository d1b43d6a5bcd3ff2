// softmax.cu: a launcher that no binding registers.  EXPECT: KD002
#include <cuda_runtime.h>

__global__ void softmax_kernel1(float* y, long long rows, int cols) {
  long long row = blockIdx.x;
  if (row >= rows) return;
  float m = -INFINITY, s = 0.0f;
  for (int c = 0; c < cols; ++c) m = fmaxf(m, y[row * cols + c]);
  for (int c = 0; c < cols; ++c) s += __expf(y[row * cols + c] - m);
  for (int c = 0; c < cols; ++c) y[row * cols + c] = __expf(y[row * cols + c] - m) / s;
}

extern "C" int softmax_launcher(float* y, long long rows, int cols, cudaStream_t stream) {
  softmax_kernel1<<<static_cast<unsigned int>(rows), 1, 0, stream>>>(y, rows, cols);
  return static_cast<int>(cudaGetLastError());
}
