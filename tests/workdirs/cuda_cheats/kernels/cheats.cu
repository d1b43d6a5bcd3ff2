// cheats.cu: y[r, f] = x[r, f] * weight[f] + bias[f] on the GPU, once correctly and in the
// deliberately wrong ways that only a real GPU shows (see ../variants/):
//   config 0  correct, one thread per element, on the given stream
//   config 1  never writes the last element of each row (left as whatever the allocator had)
//   config 2  correct, then one thread writes 256 TiB past y: an illegal address
//   config 3  correct, except that every second call moves y[0] by one ulp (a call counter
//             in device memory: a stand-in for a race that is reliable)
//   config 4  correct, but on a stream of its own followed by 2 ms of busy work, never joined
//             to the given stream: the work escapes a timer on the given stream
//   config 5  correct, on a stream of its own, never joined, with nothing after it: an escape of
//             a few microseconds, below the noise of a wall-clock check (the kernel trace sees it)
// Pure CUDA: cheats_binding.cpp checks the tensors and calls cheats_launcher on the current stream.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kSideStreamBusyNs = 2000000ull;  // 2 ms

// Calls of config 3 so far (one increment per launch, by the thread that writes y[0]).
__device__ unsigned long long g_flaky_calls = 0;

__device__ __forceinline__ float scale_one(const float* x, const float* weight, const float* bias,
                                           int64_t i, int64_t features) {
  return x[i] * weight[i % features] + bias[i % features];
}

__global__ void scale_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                             const float* __restrict__ bias, float* __restrict__ y, int64_t n, int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = scale_one(x, weight, bias, i, features);
}

__global__ void scale_skip_last_column(const float* __restrict__ x, const float* __restrict__ weight,
                                       const float* __restrict__ bias, float* __restrict__ y, int64_t n,
                                       int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && i % features != features - 1) y[i] = scale_one(x, weight, bias, i, features);
}

__global__ void scale_out_of_bounds(const float* __restrict__ x, const float* __restrict__ weight,
                                    const float* __restrict__ bias, float* y, int64_t n, int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    y[i] = scale_one(x, weight, bias, i, features);
    // 2^48 bytes on: beyond any address a process maps (x86-64 user space ends at 2^47), so it
    // faults even where the GPU may reach host memory (HMM).
    if (i == n - 1) y[i + (int64_t{1} << 46)] = 0.0f;
  }
}

__global__ void scale_every_second_call_off(const float* __restrict__ x, const float* __restrict__ weight,
                                            const float* __restrict__ bias, float* __restrict__ y, int64_t n,
                                            int64_t features) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = scale_one(x, weight, bias, i, features);
    if (i == 0 && (atomicAdd(&g_flaky_calls, 1ull) & 1ull)) v = nextafterf(v, INFINITY);
    y[i] = v;
  }
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void busy_wait(unsigned long long ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) __nanosleep(1000);
}

// A non-blocking stream: a blocking one (plain cudaStreamCreate) is implicitly ordered with
// the legacy default stream, which is torch's current stream unless set otherwise, so work
// on it would be measured, not escape.
cudaError_t side_stream(cudaStream_t* stream, cudaEvent_t* ready) {
  static cudaStream_t side = nullptr;
  static cudaEvent_t event = nullptr;
  if (side == nullptr) {
    cudaError_t err = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    if (err != cudaSuccess) return err;
    err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) return err;
  }
  *stream = side;
  *ready = event;
  return cudaSuccess;
}

}  // namespace

// Returns cudaErrorInvalidValue for an unknown config, else the launch's error.
extern "C" cudaError_t cheats_launcher(const float* x, const float* weight, const float* bias, float* y,
                                       int64_t rows, int64_t features, int config, cudaStream_t stream) {
  const int64_t n = rows * features;
  if (config < 0 || config > 5) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  switch (config) {
    case 0:
      scale_kernel<<<blocks, kThreads, 0, stream>>>(x, weight, bias, y, n, features);
      break;
    case 1:
      scale_skip_last_column<<<blocks, kThreads, 0, stream>>>(x, weight, bias, y, n, features);
      break;
    case 2:
      scale_out_of_bounds<<<blocks, kThreads, 0, stream>>>(x, weight, bias, y, n, features);
      break;
    case 3:
      scale_every_second_call_off<<<blocks, kThreads, 0, stream>>>(x, weight, bias, y, n, features);
      break;
    case 4: {
      cudaStream_t side;
      cudaEvent_t ready;
      cudaError_t err = side_stream(&side, &ready);
      if (err != cudaSuccess) return err;
      // The side stream waits for the inputs; nothing makes the given stream wait for it.
      if ((err = cudaEventRecord(ready, stream)) != cudaSuccess) return err;
      if ((err = cudaStreamWaitEvent(side, ready, 0)) != cudaSuccess) return err;
      scale_kernel<<<blocks, kThreads, 0, side>>>(x, weight, bias, y, n, features);
      busy_wait<<<1, 1, 0, side>>>(kSideStreamBusyNs);
      break;
    }
    case 5: {
      cudaStream_t side;
      cudaEvent_t ready;
      cudaError_t err = side_stream(&side, &ready);
      if (err != cudaSuccess) return err;
      if ((err = cudaEventRecord(ready, stream)) != cudaSuccess) return err;
      if ((err = cudaStreamWaitEvent(side, ready, 0)) != cudaSuccess) return err;
      scale_kernel<<<blocks, kThreads, 0, side>>>(x, weight, bias, y, n, features);
      break;
    }
  }
  return cudaGetLastError();
}
