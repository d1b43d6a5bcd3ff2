// scale_shift.cu (hog): the honest kernel, but its first call takes all the device memory it can,
// less 1 GiB, and keeps it. The candidate holds memory far beyond any case's budget: the next case
// that cannot fit must be failed as the candidate's fault, naming what its process holds, and
// sessions beside it on the same GPU that cannot fit must say the environment's.
#include <cuda_runtime.h>

#include <cstdint>

constexpr int kThreads = 256;
constexpr size_t kLeave = size_t{1} << 30;

__global__ void scale_shift_kernel0(const float* __restrict__ x, const float* __restrict__ weight,
                                    const float* __restrict__ bias, float* __restrict__ y, int64_t n,
                                    int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const int64_t f = i % features;
    y[i] = x[i] * weight[f] + bias[f];
  }
}

extern "C" cudaError_t scale_shift_launcher(const float* x, const float* weight, const float* bias, float* y,
                                            int64_t rows, int64_t features, cudaStream_t stream) {
  static void* held = nullptr;
  if (held == nullptr) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && free_bytes > 2 * kLeave) {
      if (cudaMalloc(&held, free_bytes - kLeave) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  const int64_t n = rows * features;
  if (n == 0) return cudaSuccess;
  scale_shift_kernel0<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      x, weight, bias, y, n, features);
  return cudaGetLastError();
}
