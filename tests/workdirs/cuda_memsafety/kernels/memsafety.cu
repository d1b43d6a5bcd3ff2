// memsafety.cu: y[r, f] = x[r, f] * weight[f] + bias[f] on the GPU, once correctly and with the
// memory faults that only compute-sanitizer shows (the outputs stay right; see ../variants/):
//   config 0  correct, one thread per element
//   config 1  correct, and the last thread also writes one float past the end of y (memcheck)
//   config 2  correct, and each thread reads its neighbour's slot of a shared tile that the
//             neighbour writes without a barrier in between (racecheck)
//   config 3  correct, and each thread reads a scratch buffer nobody wrote (initcheck)
// Pure CUDA: memsafety_binding.cpp checks the tensors and calls memsafety_launcher.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr float kNever = 12345.678f;  // no randn input comes near it: the reads below never change y

__device__ __forceinline__ float scale_one(const float* x, const float* weight, const float* bias,
                                           int64_t i, int64_t features) {
  return x[i] * weight[i % features] + bias[i % features];
}

__global__ void scale_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                             const float* __restrict__ bias, float* __restrict__ y, int64_t n, int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = scale_one(x, weight, bias, i, features);
}

__global__ void scale_past_end(const float* __restrict__ x, const float* __restrict__ weight,
                               const float* __restrict__ bias, float* y, int64_t n, int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = scale_one(x, weight, bias, i, features);
  if (i == n - 1) y[n] = 0.0f;  // one element past the output: the write memcheck must name
}

__global__ void scale_shared_race(const float* __restrict__ x, const float* __restrict__ weight,
                                  const float* __restrict__ bias, float* __restrict__ y, int64_t n,
                                  int64_t features) {
  __shared__ float tile[kThreads];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  const float neighbour = tile[(threadIdx.x + 1) % blockDim.x];  // no __syncthreads(): the race racecheck must name
  if (i < n) y[i] = neighbour == kNever ? 0.0f : scale_one(x, weight, bias, i, features);
}

__global__ void scale_uninitialised(const float* __restrict__ x, const float* __restrict__ weight,
                                    const float* __restrict__ bias, const float* __restrict__ scratch,
                                    float* __restrict__ y, int64_t n, int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float unwritten = scratch[i];  // never written by anyone: the read initcheck must name
    y[i] = unwritten == kNever ? 0.0f : scale_one(x, weight, bias, i, features);
  }
}

}  // namespace

// Launches config 0..3 on `stream`; `scratch` (n floats, uninitialised) is read by config 3 only.
// Returns the launch's error (cudaErrorInvalidValue for an unknown config).
extern "C" cudaError_t memsafety_launcher(const float* x, const float* weight, const float* bias,
                                          const float* scratch, float* y, int64_t rows, int64_t features,
                                          int config, cudaStream_t stream) {
  const int64_t n = rows * features;
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  switch (config) {
    case 0: scale_kernel<<<blocks, kThreads, 0, stream>>>(x, weight, bias, y, n, features); break;
    case 1: scale_past_end<<<blocks, kThreads, 0, stream>>>(x, weight, bias, y, n, features); break;
    case 2: scale_shared_race<<<blocks, kThreads, 0, stream>>>(x, weight, bias, y, n, features); break;
    case 3: scale_uninitialised<<<blocks, kThreads, 0, stream>>>(x, weight, bias, scratch, y, n, features); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
