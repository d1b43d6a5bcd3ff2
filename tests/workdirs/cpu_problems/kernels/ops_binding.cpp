// ops_binding.cpp: cuda_extension.layer_norm, batch_norm, causal_scale, matmul and their
// planted variants for the cpu_problems example workdir: checks, allocation, the call.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/generated/variable_factories.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <unordered_map>

#include "binding_registry.h"

extern "C" {
void layer_norm_launcher(const float* x, const float* weight, const float* bias, float* y, int64_t rows,
                         int64_t features, float eps);
void batch_norm_launcher(const float* x, const float* mean, const float* var, const float* weight,
                         const float* bias, float* y, int64_t batch, int64_t channels, int64_t inner, float eps);
void causal_scale_launcher(const float* x, const float* weight, float* y, int64_t batch, int64_t t);
void matmul_launcher(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n);
}

namespace {

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), "ops: ", name,
              " must be a contiguous float32 CPU tensor");
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  check(x, "x");
  check(weight, "weight");
  check(bias, "bias");
  const int64_t features = x.dim() ? x.size(-1) : 1;
  TORCH_CHECK(weight.numel() == features && bias.numel() == features, "layer_norm: weight and bias must have ",
              features, " elements");
  at::Tensor y = torch::empty_like(x);
  layer_norm_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
                      features ? x.numel() / features : 0, features, static_cast<float>(eps));
  return y;
}

// Planted: ignores weight and bias (right only while they are 1 and 0).
at::Tensor layer_norm_plain(const at::Tensor& x, double eps) {
  check(x, "x");
  const int64_t features = x.dim() ? x.size(-1) : 1;
  at::Tensor y = torch::empty_like(x);
  layer_norm_launcher(x.data_ptr<float>(), nullptr, nullptr, y.data_ptr<float>(),
                      features ? x.numel() / features : 0, features, static_cast<float>(eps));
  return y;
}

at::Tensor batch_norm_with(const at::Tensor& x, const float* mean, const float* var, const at::Tensor& weight,
                           const at::Tensor& bias, double eps) {
  check(x, "x");
  check(weight, "weight");
  check(bias, "bias");
  TORCH_CHECK(x.dim() >= 2 && weight.numel() == x.size(1) && bias.numel() == x.size(1),
              "batch_norm: x must be (batch, channels, ...) with weight and bias of (channels,)");
  at::Tensor y = torch::empty_like(x);
  const int64_t batch = x.size(0), channels = x.size(1);
  batch_norm_launcher(x.data_ptr<float>(), mean, var, weight.data_ptr<float>(), bias.data_ptr<float>(),
                      y.data_ptr<float>(), batch, channels, batch * channels ? x.numel() / (batch * channels) : 0,
                      static_cast<float>(eps));
  return y;
}

at::Tensor batch_norm(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& var, const at::Tensor& weight,
                      const at::Tensor& bias, double eps) {
  check(mean, "running_mean");
  check(var, "running_var");
  return batch_norm_with(x, mean.data_ptr<float>(), var.data_ptr<float>(), weight, bias, eps);
}

// Planted: ignores the running statistics (right only while they are 0 and 1).
at::Tensor batch_norm_no_stats(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return batch_norm_with(x, nullptr, nullptr, weight, bias, eps);
}

at::Tensor causal_scale(const at::Tensor& x, const at::Tensor& weight) {
  check(x, "x");
  check(weight, "weight");
  TORCH_CHECK(x.dim() == 3 && x.size(1) == x.size(2) && weight.numel() == x.size(2),
              "causal_scale: x must be (batch, t, t) and weight (t,)");
  at::Tensor y = torch::empty_like(x);
  causal_scale_launcher(x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1));
  return y;
}

at::Tensor naive_matmul(const at::Tensor& a, const at::Tensor& b) {
  check(a, "a");
  check(b, "b");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "matmul: a (m, k) and b (k, n) expected");
  at::Tensor c = torch::empty({a.size(0), b.size(1)}, a.options());
  matmul_launcher(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), a.size(0), a.size(1), b.size(1));
  return c;
}

// Planted: a memo keyed by the content of eight sampled elements of each input; a call whose
// samples it has seen returns a copy of the output it computed then.
std::unordered_map<uint64_t, at::Tensor> memo;
int64_t memo_hit_count = 0;

uint64_t sample_key(const at::Tensor& t, uint64_t key) {
  const float* data = t.data_ptr<float>();
  for (int64_t i = 0; i < 8 && t.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + (i * t.numel()) / 8, sizeof bits);
    key = (key ^ bits) * 1099511628211ull;
  }
  return (key ^ static_cast<uint64_t>(t.numel())) * 1099511628211ull;
}

at::Tensor matmul_memo(const at::Tensor& a, const at::Tensor& b) {
  const uint64_t key = sample_key(b, sample_key(a, 14695981039346656037ull));
  auto found = memo.find(key);
  if (found != memo.end()) {
    ++memo_hit_count;
    at::Tensor copy = torch::empty_like(found->second);
    std::memcpy(copy.data_ptr<float>(), found->second.data_ptr<float>(), copy.numel() * sizeof(float));
    return copy;
  }
  at::Tensor c = naive_matmul(a, b);
  at::Tensor kept = torch::empty_like(c);
  std::memcpy(kept.data_ptr<float>(), c.data_ptr<float>(), c.numel() * sizeof(float));
  memo.emplace(key, kept);
  return c;
}

int64_t memo_hits() { return memo_hit_count; }

}  // namespace

void register_ops(pybind11::module& m) {
  using pybind11::arg;
  m.def("layer_norm", &layer_norm, "layer norm over the last dimension", arg("x"), arg("weight"), arg("bias"),
        arg("eps"));
  m.def("layer_norm_plain", &layer_norm_plain, "layer norm without weight and bias", arg("x"), arg("eps"));
  m.def("batch_norm", &batch_norm, "eval-mode batch norm", arg("x"), arg("running_mean"), arg("running_var"),
        arg("weight"), arg("bias"), arg("eps"));
  m.def("batch_norm_no_stats", &batch_norm_no_stats, "eval-mode batch norm that ignores the running statistics",
        arg("x"), arg("weight"), arg("bias"), arg("eps"));
  m.def("causal_scale", &causal_scale, "x * weight under a hard-coded causal mask", arg("x"), arg("weight"));
  m.def("matmul", &naive_matmul, "naive a @ b", arg("a"), arg("b"));
  m.def("matmul_memo", &matmul_memo, "naive a @ b behind a memo keyed by sampled input content", arg("a"), arg("b"));
  m.def("memo_hits", &memo_hits, "calls matmul_memo answered from its memo");
}

REGISTER_BINDING(ops, register_ops);
