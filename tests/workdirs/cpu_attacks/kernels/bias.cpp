// bias.cpp: y = x + b over the rows of a (rows, cols) float32 input (add_bias), and drop_bias, which
// copies x and leaves b out: the wrong kernel of tests/exploits/.
#include <cstdint>

extern "C" void attack_add_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] + b[c];
}

extern "C" void attack_drop_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols) {
  (void)b;
  for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
