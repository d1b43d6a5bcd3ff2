// linear.cpp: y = relu(x @ weight^T + linear_bias + bias) on the CPU, KernelBench level 2 in small
// (Linear, a bias added, ReLU), right, and wrong in one planted way for the tests.
// Per output element one dot product of in_features (2 * in_features FLOPs); x and weight
// are read once per row block, y written once. Pure C++: linear_binding.cpp checks and allocates.
#include <cstdint>

namespace {

// Rows are taken in blocks of this many (the tuning the planted variant gets wrong).
constexpr int64_t kRowBlock = 8;

float row_element(const float* xr, const float* weight, const float* linear_bias, const float* bias,
                  int64_t in_features, int64_t o, bool with_bias) {
  double sum = linear_bias[o] + (with_bias ? bias[o] : 0.0);
  for (int64_t i = 0; i < in_features; ++i) sum += static_cast<double>(xr[i]) * weight[o * in_features + i];
  return sum > 0.0 ? static_cast<float>(sum) : 0.0f;
}

}  // namespace

extern "C" {

// config 0: every row. config 1 (planted): full blocks of kRowBlock rows and the last row are
// right; the other rows of a partial last block forget `bias` (right for 1, 8, 9, 16, 17 rows).
void linear_bias_relu_launcher(const float* x, const float* weight, const float* linear_bias, const float* bias,
                               float* y, int64_t rows, int64_t in_features, int64_t out_features, int config) {
  const int64_t full = rows - rows % kRowBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const bool with_bias = config == 0 || r < full || r == rows - 1;
    for (int64_t o = 0; o < out_features; ++o)
      y[r * out_features + o] = row_element(x + r * in_features, weight, linear_bias, bias, in_features, o,
                                            with_bias);
  }
}

}  // extern "C"
