// masked_cumsum.cpp: y = cumsum(x * mask) along one dimension, float32 x, bool mask, on the CPU.
// Viewed as [outer, n, inner] around the summed dimension; one read of x and mask and one write
// of y per element (9 bytes), a running sum per (outer, inner) lane in float, as torch does.
#include <cstdint>

// Returns 0, or 1 for an unknown config. config 0: lanes of `inner` summed side by side.
extern "C" int masked_cumsum_launcher(const float* x, const bool* mask, float* y, int64_t outer, int64_t n,
                                      int64_t inner, int config) {
  if (config != 0) return 1;
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t base = o * n * inner;
    for (int64_t j = 0; j < inner; ++j) y[base + j] = mask[base + j] ? x[base + j] : 0.f;
    for (int64_t i = 1; i < n; ++i) {
      const int64_t row = base + i * inner;
      for (int64_t j = 0; j < inner; ++j) y[row + j] = y[row - inner + j] + (mask[row + j] ? x[row + j] : 0.f);
    }
  }
  return 0;
}
