// gelu.cu: y = gelu_tanh(y + bias) in place, fp32, bias broadcast over rows.
// One read and one write of 4 bytes per element: bandwidth bound.
#include <cuda_runtime.h>
#include <math.h>

#include "common.cuh"
#include "binding_registry.h"  // EXPECT: KC003

constexpr unsigned int kGeluThreads = 256;

__global__ void gelu_kernel1(float* y, const float* bias, long long n, int cols, float scale) {
  long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i < n) {
    float v = y[i] + (bias != nullptr ? bias[i % cols] : 0.0f);
    y[i] = 0.5f * v * (1.0f + tanhf(scale * (v + 0.044715f * v * v * v)));
  }
}

void register_gelu_raw(pybind11::module& m) {
  m.def("gelu_raw", &gelu_kernel1);
}

REGISTER_BINDING(gelu_raw, register_gelu_raw);  // EXPECT: KC003

extern "C" int gelu_launcher(float* y, const float* bias, long long n, int cols, float scale, int config,
                             cudaStream_t stream) {
  (void)config;  // one variant
  gelu_kernel1<<<blocks_for(n, kGeluThreads), kGeluThreads, 0, stream>>>(y, bias, n, cols, scale);
  return static_cast<int>(cudaGetLastError());
}
