// linear_min_sub.cpp: y = min(x W^T + b, c) - c, float32, on the CPU.
// x [M, K], W [N, K], b [N], c a scalar; y [M, N]. 2*M*N*K FLOPs (68.7 G at 128 x 16384 x 16384);
// W is read once per K block (1 GiB), x from L2. One thread (KC009): a 2 x 4 register tile of
// 16-wide AVX-512 dot products over a K block, summed into y block by block.
#pragma GCC target("avx512f,avx2,fma")
#include <cstdint>

namespace {
typedef float v16 __attribute__((vector_size(64)));
constexpr int64_t KC = 1024;  // K block: a 2-row x panel and 4 W rows, 24 KiB, stay in L1/L2

inline float hsum(v16 v) {
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

inline v16 load(const float* p) {
  v16 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// acc[r][c] += dot(x row r, W row c) over [k0, k1): rows i..i+1 of x, j..j+3 of W.
void tile(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t i, int64_t j, int64_t k0,
          int64_t k1, int rows, int cols) {
  v16 acc[2][4] = {};
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    v16 a[2], b[4];
    for (int r = 0; r < rows; ++r) a[r] = load(x + (i + r) * K + k);
    for (int c = 0; c < cols; ++c) b[c] = load(w + (j + c) * K + k);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) acc[r][c] += a[r] * b[c];
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t t = k; t < k1; ++t) s += x[(i + r) * K + t] * w[(j + c) * K + t];
      y[(i + r) * N + j + c] += s;
    }
}
}  // namespace

// Returns 0, or 1 for an unknown config. config 0: the blocked loop above.
extern "C" int linear_min_sub_launcher(const float* x, const float* w, const float* b, const float* c, float* y,
                                       int64_t M, int64_t K, int64_t N, int config) {
  if (config != 0) return 1;
  for (int64_t t = 0; t < M * N; ++t) y[t] = 0.f;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t k1 = k0 + KC < K ? k0 + KC : K;
    for (int64_t j = 0; j < N; j += 4) {
      const int cols = N - j < 4 ? static_cast<int>(N - j) : 4;
      for (int64_t i = 0; i < M; i += 2) {
        const int rows = M - i < 2 ? static_cast<int>(M - i) : 2;
        tile(x, w, y, K, N, i, j, k0, k1, rows, cols);
      }
    }
  }
  const float cv = *c;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const float v = y[i * N + j] + b[j];
      y[i * N + j] = (v < cv ? v : cv) - cv;
    }
  return 0;
}
