// linear_binding.cpp: cuda_extension.linear_bias_relu(x, weight, linear_bias, bias, config=0) for the
// cpu_problems example workdir (variants/linear_relu): checks, allocation, the call.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" void linear_bias_relu_launcher(const float* x, const float* weight, const float* linear_bias,
                                          const float* bias, float* y, int64_t rows, int64_t in_features,
                                          int64_t out_features, int config);

namespace {

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), "linear_bias_relu: ",
              name, " must be a contiguous float32 CPU tensor; got ", t.scalar_type(), " of shape ", t.sizes());
}

at::Tensor linear_bias_relu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& linear_bias,
                            const at::Tensor& bias, int64_t config) {
  check_float(x, "x");
  check_float(weight, "weight");
  check_float(linear_bias, "linear_bias");
  check_float(bias, "bias");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.size(1) == x.size(1),
              "linear_bias_relu: x must be (batch, in_features) and weight (out_features, in_features); got x ",
              x.sizes(), " and weight ", weight.sizes());
  const int64_t out_features = weight.size(0);
  TORCH_CHECK(linear_bias.dim() == 1 && linear_bias.size(0) == out_features,
              "linear_bias_relu: linear_bias must have shape (", out_features, ",); got ", linear_bias.sizes());
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear_bias_relu: bias must have shape (",
              out_features, ",) (out_features); got ", bias.sizes());
  TORCH_CHECK(config == 0 || config == 1, "linear_bias_relu: unknown config ", config,
              " (0: right, 1: planted row-block bug)");
  at::Tensor y = torch::empty({x.size(0), out_features}, x.options());
  linear_bias_relu_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), linear_bias.data_ptr<float>(),
                            bias.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1), out_features,
                            static_cast<int>(config));
  return y;
}

}  // namespace

void register_linear(pybind11::module& m) {
  m.def("linear_bias_relu", &linear_bias_relu,
        "linear_bias_relu(x, weight, linear_bias, bias, config=0) -> y: relu(x @ weight^T + linear_bias + bias) "
        "for x (batch, in_features), weight (out_features, in_features), linear_bias and bias (out_features,); "
        "config 1 is the planted variant that forgets bias on some rows of a partial row block",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("linear_bias"), pybind11::arg("bias"),
        pybind11::arg("config") = 0);
}

REGISTER_BINDING(linear, register_linear);
