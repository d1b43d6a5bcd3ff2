// global_l2norm_binding.cpp: cuda_extension.global_l2norm_forward(x, eps, config=0): checks, allocation, launch.
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include "../binding_registry.h"

extern "C" int global_l2norm_max_blocks(int device);
extern "C" int global_l2norm_launcher(const float* x, float* y, float* partials, int partials_capacity,
                                      long long n, float eps, int config, int device, cudaStream_t stream);

torch::Tensor global_l2norm_forward(torch::Tensor x, double eps, int64_t config = 0) {
  TORCH_CHECK(x.is_cuda(), "global_l2norm: x must be a CUDA tensor; got device ", x.device());
  TORCH_CHECK(x.is_contiguous(), "global_l2norm: x must be contiguous; got strides ", x.strides(),
              " for shape ", x.sizes());
  TORCH_CHECK(x.dtype() == torch::kFloat32, "global_l2norm: x must be float32; got ", x.dtype());
  auto y = torch::empty_like(x);
  const int device = x.get_device();
  const int capacity = global_l2norm_max_blocks(device);
  auto partials = torch::empty({capacity}, x.options());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const int status = global_l2norm_launcher(x.data_ptr<float>(), y.data_ptr<float>(), partials.data_ptr<float>(),
                                            capacity, x.numel(), static_cast<float>(eps),
                                            static_cast<int>(config), device, stream);
  TORCH_CHECK(status == 0, "global_l2norm: launch failed (config ", config, "; 0 fused, 1 two passes): ",
              cudaGetErrorString(static_cast<cudaError_t>(status)));
  return y;
}

// Registration function
void register_global_l2norm(pybind11::module& m) {
  m.def("global_l2norm_forward", &global_l2norm_forward,
        "global_l2norm_forward(x, eps, config=0) -> y = x * rsqrt(sum(x^2) + eps); x float32, contiguous, CUDA",
        py::arg("x"), py::arg("eps"), py::arg("config") = 0);
}

// Auto-register
REGISTER_BINDING(global_l2norm, register_global_l2norm);
