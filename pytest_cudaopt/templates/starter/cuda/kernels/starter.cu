// starter.cu: y = x, element by element, float32: the starting kernel `cudaopt init` leaves.
// Replace it with the model's kernels (see README.md). Per element one read and one write,
// 8 bytes: on an H200 (~4.3 TB/s) the floor is n * 8 B / 4.3e12 B/s.
// Pure CUDA: starter_binding.cpp checks the tensors and calls starter_launcher on the current stream.
#include <cuda_runtime.h>

#include <cstdint>

constexpr int kThreads = 256;  // threads per block

// config 0: one thread per element.
__global__ void starter_kernel0(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}

// Returns cudaErrorInvalidValue for an unknown config, else the launch's error.
extern "C" cudaError_t starter_launcher(const float* x, float* y, int64_t n, int config, cudaStream_t stream) {
  if (config != 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  starter_kernel0<<<blocks, kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}
