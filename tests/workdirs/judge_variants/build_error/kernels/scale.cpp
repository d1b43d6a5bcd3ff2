// scale.cpp, a variant that does not compile: an undeclared name (the judge's build failure).
// Per element one read of x and one write of y (8 bytes); weight and bias stay in cache.
// Pure C++: no torch here; scale_binding.cpp checks the tensors and calls scale_launcher.
#include <cstdint>

namespace {

// config 0: one pass per row.
void scale_rows(const float* x, const float* weight, const float* bias, float* y,
                int64_t rows, int64_t features) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * features;
    float* yr = y + r * features;
    for (int64_t f = 0; f < features; ++f) yr[f] = xr[f] * weight[f] + bias[f] + undeclared_offset;
  }
}

// config 1: one pass per feature (column order; slower, kept as the variant to compare).
void scale_columns(const float* x, const float* weight, const float* bias, float* y,
                   int64_t rows, int64_t features) {
  for (int64_t f = 0; f < features; ++f)
    for (int64_t r = 0; r < rows; ++r) y[r * features + f] = x[r * features + f] * weight[f] + bias[f];
}

}  // namespace

// Returns 0, or 1 for an unknown config.
extern "C" int scale_launcher(const float* x, const float* weight, const float* bias, float* y,
                              int64_t rows, int64_t features, int config) {
  switch (config) {
    case 0: scale_rows(x, weight, bias, y, rows, features); return 0;
    case 1: scale_columns(x, weight, bias, y, rows, features); return 0;
    default: return 1;
  }
}
