// cheats.cpp: y[r, f] = x[r, f] * weight[f] + bias[f] on the CPU, once correctly and in the
// deliberately wrong ways that the correctness verdict must reject (see ../variants/).
// Pure C++: no torch here; cheats_binding.cpp checks the tensors and calls the launchers.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

inline float scale_one(const float* x, const float* weight, const float* bias, int64_t i, int64_t features) {
  return x[i] * weight[i % features] + bias[i % features];
}

// Round to the nearest bfloat16 (ties to even), kept in a float: 8 mantissa bits.
inline float round_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if (std::isnan(v)) return v;
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace

// config 0, correct: every element.
extern "C" void cheat_scale(const float* x, const float* weight, const float* bias, float* y,
                            int64_t n, int64_t features) {
  for (int64_t i = 0; i < n; ++i) y[i] = scale_one(x, weight, bias, i, features);
}

// Vectorised by 8 with no tail loop: right whenever n is a multiple of 8 (the canonical
// 16 x 64), the last n % 8 elements never written otherwise.
extern "C" void cheat_scale_no_tail(const float* x, const float* weight, const float* bias, float* y,
                                    int64_t n, int64_t features) {
  for (int64_t i = 0; i + 8 <= n; i += 8)
    for (int64_t k = 0; k < 8; ++k) y[i + k] = scale_one(x, weight, bias, i + k, features);
}

// Leaves the last element unwritten at every shape.
extern "C" void cheat_scale_skip_last(const float* x, const float* weight, const float* bias, float* y,
                                      int64_t n, int64_t features) {
  for (int64_t i = 0; i + 1 < n; ++i) y[i] = scale_one(x, weight, bias, i, features);
}

// Right values, but every second call nudges y[0] by one ulp (a stand-in for a race).
extern "C" void cheat_scale_flaky(const float* x, const float* weight, const float* bias, float* y,
                                  int64_t n, int64_t features) {
  static int64_t calls = 0;
  for (int64_t i = 0; i < n; ++i) y[i] = scale_one(x, weight, bias, i, features);
  if (n > 0 && (calls++ % 2) == 1) y[0] = std::nextafter(y[0], INFINITY);
}

// Reduced precision: the result rounded to bfloat16 (relative error <= 2^-9, within 1e-2).
extern "C" void cheat_scale_bf16(const float* x, const float* weight, const float* bias, float* y,
                                 int64_t n, int64_t features) {
  for (int64_t i = 0; i < n; ++i) y[i] = round_bf16(scale_one(x, weight, bias, i, features));
}
