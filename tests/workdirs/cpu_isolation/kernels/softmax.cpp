// softmax.cpp: row softmax and row sigmoid on the CPU (the isolation workdir's "kernels").
// The sigmoid is what a candidate computes when it has made the reference compute it too.
#include <cmath>
#include <cstdint>

namespace {

template <typename T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    T top = xr[0];
    for (int64_t c = 1; c < cols; ++c) top = xr[c] > top ? xr[c] : top;
    T sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += (yr[c] = std::exp(xr[c] - top));
    for (int64_t c = 0; c < cols; ++c) yr[c] /= sum;
  }
}

template <typename T>
void sigmoid_all(const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
}

}  // namespace

extern "C" void isolation_softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
  softmax_rows(x, y, rows, cols);
}

extern "C" void isolation_sigmoid_f32(const float* x, float* y, int64_t n) { sigmoid_all(x, y, n); }

extern "C" void isolation_sigmoid_f64(const double* x, double* y, int64_t n) { sigmoid_all(x, y, n); }
