// ops.cpp: the CPU "kernels" of the cpu_problems example workdir, each right or wrong in one
// planted way (tests/test_state.py and tests/test_perf_verdict.py pick them through variants/).
// Pure C++: no torch here; ops_binding.cpp checks the tensors, allocates and calls these.
#include <cmath>
#include <cstdint>

extern "C" {

// y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias over the last dimension (features).
void layer_norm_launcher(const float* x, const float* weight, const float* bias, float* y,
                         int64_t rows, int64_t features, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * features;
    double mean = 0.0, var = 0.0;
    for (int64_t f = 0; f < features; ++f) mean += xr[f];
    mean /= static_cast<double>(features);
    for (int64_t f = 0; f < features; ++f) var += (xr[f] - mean) * (xr[f] - mean);
    var /= static_cast<double>(features);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t f = 0; f < features; ++f) {
      const double norm = (xr[f] - mean) * inv;
      y[r * features + f] = static_cast<float>(weight ? norm * weight[f] + bias[f] : norm);
    }
  }
}

// Eval-mode batch norm of x (batch, channels, inner): per channel c,
// y = (x - mean[c]) / sqrt(var[c] + eps) * weight[c] + bias[c]; without mean and var
// (nullptr) the running statistics are taken to be their defaults 0 and 1.
void batch_norm_launcher(const float* x, const float* mean, const float* var, const float* weight,
                         const float* bias, float* y, int64_t batch, int64_t channels, int64_t inner,
                         float eps) {
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c) {
      const double m = mean ? mean[c] : 0.0;
      const double inv = 1.0 / std::sqrt((var ? var[c] : 1.0) + eps);
      const int64_t base = (n * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i)
        y[base + i] = static_cast<float>((x[base + i] - m) * inv * weight[c] + bias[c]);
    }
}

// y[b, i, j] = x[b, i, j] * weight[j] for j <= i, else 0: the causal mask hard-coded.
void causal_scale_launcher(const float* x, const float* weight, float* y, int64_t batch, int64_t t) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j) {
        const int64_t at = (b * t + i) * t + j;
        y[at] = j <= i ? x[at] * weight[j] : 0.0f;
      }
}

// c = a @ b for a (m, k) and b (k, n), one dot product per element (deliberately naive).
void matmul_launcher(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(a[i * k + p]) * b[p * n + j];
      c[i * n + j] = static_cast<float>(sum);
    }
}

}  // extern "C"
