// checks.h: argument checks shared by the *_binding.cpp files; messages name the op, the
// argument and the rule it broke.
#pragma once

#include <ATen/core/Tensor.h>

// dtype and layout first, so that a CPU tensor with the wrong dtype or strides is told so.
inline void check_cuda_float32_contiguous(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got shape ", t.sizes(),
              " with strides ", t.strides());
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor, got one on ", t.device());
}

inline void check_same_device(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                              const char* b_name, const char* op) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", a_name, " and ", b_name,
              " must be on the same device, got ", a.device(), " and ", b.device());
}
