// cheats_binding.cpp: the cheat workdir's bindings, one per way of getting y = x * weight + bias
// wrong (or right) that tests/test_correctness_verdict.py plants in a model_new.py.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>

#include "binding_registry.h"

using Kernel = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t);

extern "C" void cheat_scale(const float*, const float*, const float*, float*, int64_t, int64_t);
extern "C" void cheat_scale_no_tail(const float*, const float*, const float*, float*, int64_t, int64_t);
extern "C" void cheat_scale_skip_last(const float*, const float*, const float*, float*, int64_t, int64_t);
extern "C" void cheat_scale_flaky(const float*, const float*, const float*, float*, int64_t, int64_t);
extern "C" void cheat_scale_bf16(const float*, const float*, const float*, float*, int64_t, int64_t);

namespace {

void check(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  for (const at::Tensor* t : {&x, &weight, &bias}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->device().is_cpu(),
                "cheats: x, weight and bias must be contiguous float32 CPU tensors");
  }
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1) && bias.sizes() == weight.sizes(),
              "cheats: x must be (batch, features), weight and bias (features,); got ", x.sizes(), ", ",
              weight.sizes(), ", ", bias.sizes());
}

at::Tensor run(Kernel kernel, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
               at::Tensor y) {
  kernel(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
         x.numel(), x.size(1));
  return y;
}

at::Tensor with(Kernel kernel, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  check(x, w, b);
  return run(kernel, x, w, b, torch::empty_like(x));
}

at::Tensor scale(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) { return with(cheat_scale, x, w, b); }
at::Tensor scale_no_tail(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return with(cheat_scale_no_tail, x, w, b);
}
at::Tensor scale_skip_last(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return with(cheat_scale_skip_last, x, w, b);
}
at::Tensor scale_flaky(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return with(cheat_scale_flaky, x, w, b);
}
at::Tensor scale_bf16(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return with(cheat_scale_bf16, x, w, b);
}

// Writes the result into x and returns x itself.
at::Tensor scale_in_place(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  check(x, w, b);
  return run(cheat_scale, x, w, b, x);
}

// Returns a fresh, correct y, and uses x as scratch space on the way (x ends up scaled too).
at::Tensor scale_scratch_input(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  at::Tensor y = with(cheat_scale, x, w, b);
  run(cheat_scale, x, w, b, x);
  return y;
}

// The arithmetic done by ATen ops from C++ instead of a kernel.
at::Tensor scale_aten(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  check(x, w, b);
  return at::add(at::mul(x, w), b);
}

// What an illegal memory access looks like from Python, without a GPU.
at::Tensor scale_fault(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  check(x, w, b);
  throw std::runtime_error("CUDA error: an illegal memory access was encountered (simulated by scale_fault)");
}

}  // namespace

#define CHEAT_ARGS pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias")
void register_cheats(pybind11::module& m) {
  m.def("scale", &scale, "scale(x, weight, bias) -> y = x * weight + bias (correct)", CHEAT_ARGS);
  m.def("scale_no_tail", &scale_no_tail, "correct only when x.numel() % 8 == 0", CHEAT_ARGS);
  m.def("scale_skip_last", &scale_skip_last, "never writes the last element of y", CHEAT_ARGS);
  m.def("scale_flaky", &scale_flaky, "every second call differs from the first by one ulp", CHEAT_ARGS);
  m.def("scale_bf16", &scale_bf16, "y rounded to bfloat16", CHEAT_ARGS);
  m.def("scale_in_place", &scale_in_place, "writes y into x and returns x", CHEAT_ARGS);
  m.def("scale_scratch_input", &scale_scratch_input, "fresh y, but x overwritten", CHEAT_ARGS);
  m.def("scale_aten", &scale_aten, "y computed by at::mul and at::add", CHEAT_ARGS);
  m.def("scale_fault", &scale_fault, "raises a (simulated) CUDA error", CHEAT_ARGS);
}

REGISTER_BINDING(cheats, register_cheats);
