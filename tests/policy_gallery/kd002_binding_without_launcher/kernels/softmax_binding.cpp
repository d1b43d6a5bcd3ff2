// softmax_binding.cpp: registers softmax, whose softmax.cu is missing.  EXPECT: KD002
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" int softmax_launcher(float* y, long long rows, int cols, cudaStream_t stream);

torch::Tensor softmax_forward(torch::Tensor y) {
  TORCH_CHECK(y.is_cuda() && y.dim() == 2, "softmax: y must be a 2-D CUDA tensor");
  int status = softmax_launcher(y.data_ptr<float>(), y.size(0), static_cast<int>(y.size(1)),
                                at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == 0, "softmax: launch failed");
  return y;
}

void register_softmax(pybind11::module& m) {
  m.def("softmax", &softmax_forward, "softmax(y) -> y, in place over the last dimension",
        pybind11::arg("y"));
}

REGISTER_BINDING(softmax, register_softmax);
