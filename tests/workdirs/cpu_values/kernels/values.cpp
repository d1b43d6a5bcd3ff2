// values.cpp: a row softmax and a mean squared error on the CPU, each once correctly and once in a
// way right only for model.py's own input values (see ../variants/). Pure C++: values_binding.cpp
// checks the tensors and calls these launchers.
#include <cmath>
#include <cstdint>

// Row softmax, the row max subtracted first: exp never overflows.
extern "C" void softmax_launcher(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    float most = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) most = std::fmax(most, in[c]);
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += out[c] = std::exp(in[c] - most);
    for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<float>(out[c] / sum);
  }
}

// Planted: exp(x) / sum(exp(x)) without the max: inf / inf = NaN once an input passes ~88.
extern "C" void softmax_no_max_launcher(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += out[c] = std::exp(in[c]);
    for (int64_t c = 0; c < cols; ++c) out[c] /= sum;
  }
}

// mean((p - t)^2) over n elements, every `stride`-th one, accumulated in double.
extern "C" void mse_launcher(const float* p, const float* t, float* out, int64_t n, int64_t stride) {
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; i += stride, ++count) {
    const double d = static_cast<double>(p[i]) - static_cast<double>(t[i]);
    sum += d * d;
  }
  out[0] = static_cast<float>(count ? sum / static_cast<double>(count) : NAN);
}
