// attention.cu: GPT-2 causal self-attention core, flash style, at float32 accuracy.
//
// Computes, for every batch b, head h and query row i (C = H * D, D = head size):
//   y[b, i, h*D:(h+1)*D] = sum_{j <= i} softmax_j(q_i . k_j / sqrt(D)) v_j
// reading q, k, v straight from the c_attn output qkv (B, T, 3C) = [q | k | v] along the last
// axis and writing y in the (B, T, C) layout that c_proj reads: no transposes, no copies, and
// the T x T score matrix never reaches memory (online softmax over key tiles).
//
// Napkin math at the canonical shape B=16, T=1024, C=768, H=12, D=64:
//   FLOPs: QK^T and PV are 2*B*H*T*T*D each, halved by the causal mask: 2 x 12.9 = 25.8 GFLOP
//          (64x64 tiles compute the whole diagonal tile: +6%), and B*H*T*T/2 = 101 M exp2.
//   bytes: qkv read once from HBM (151 MB; K/V tiles are re-read per query tile, from L2) and
//          y written once (50 MB): 201 MB / 4.3 TB/s = 47 us, so the kernel is compute-bound.
//   floor: 25.8 GFLOP / ~60 TFLOP/s of fp32 FFMA = 0.43 ms. On the tensor cores with 3xTF32
//          (x = hi + lo, x*y ~ hi*hi + hi*lo + lo*hi: three tf32 products per fp32 product,
//          fp32-level error): 77 GFLOP of tf32 work, on wgmma at the measured ~411 TFLOP/s
//          0.19 ms (82 GFLOP, 0.20 ms, for the 64-row x 64-key tiles the wgmma kernel computes).
//   measured (H200): warp-specialised wgmma kernel 0.282 ms = 92 TFLOP/s of fp32-accurate
//          attention (291 TFLOP/s of tf32 work, 71% of that peak; ncu: tensor pipe active 60% of
//          cycles); the lockstep wgmma kernel it replaced 0.375 ms; mma.sync kernel 0.460 ms; a
//          plain FFMA flash kernel 0.853 ms; torch's fp32 SDPA 0.896 ms.
//          Error vs float64 0.55x-2.5x the fp32 reference's, flat in T up to 4096.
//
// Kernels (the launcher's `config` picks one; see attention_launcher at the end):
//   attention_kernel_ws      3xTF32 on Hopper's wgmma.m64n64k8, warp-specialised: a producer
//                            warpgroup stages K/V by TMA and splits them into a ring of split
//                            tiles, two consumer warpgroups of 64 query rows each run S, softmax
//                            and PV with no block-wide barrier; persistent grid; D = 64, sm_90a.
//   attention_kernel_mma     3xTF32 mma.sync m16n8k8, 16 query rows per warp slab, K/V tiles
//                            pipelined in shared memory by cp.async; D in {32, 64, 96, 128}.
//   attention_kernel_generic one warp per query row, any head size D (slow, always correct).
// Masking: tiles wholly below the diagonal run a code path with no mask at all; only the tiles
// that cross the diagonal take the masked path (a select per score, no branch). Tiles above the
// diagonal are never loaded. The 1/sqrt(D) scale and log2(e) are folded into one multiplier of
// exp2. Build: part of cuda_extension (bash utils/compile.sh); bench: benchmarks/bench_attention.py.
#include "attention.h"

#include "hopper.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr double kLog2e = 1.4426950408889634;  // log2(e): exp(x) = exp2(x * log2(e))
// tf32 keeps the top 19 bits of an fp32 (sign, 8 exponent, 10 mantissa bits): the mask clears the
// 13 low mantissa bits, and adding half of the lowest kept bit first rounds to nearest.
constexpr uint32_t kTf32KeepMask = 0xffffe000u;
constexpr uint32_t kTf32HalfUlp = 0x1000u;

// ---------------------------------------------------------------------------------------------
// Small device helpers
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));  // 2 ulp; exp2(-inf) = +0
  return r;
}

// x = hi + lo for 3xTF32. hi = x rounded to tf32 by adding half a tf32 ulp to the bit pattern and
// truncating (2 integer ops; cvt.rna.tf32.f32 costs 4 SASS ops with its inf/NaN handling, and
// every operand here is finite); lo = x - hi, exact by Sterbenz. lo goes in unconverted: the tensor
// core reads only its top 19 bits, truncating lo at ~2^-21 |x|. In a float64 emulation of a K=64
// dot product this gives 2.5e-7 relative error either way (lo rounded or not), against 1.5e-7 for
// an fp32 dot product and 2.9e-4 for plain TF32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = (__float_as_uint(x) + kTf32HalfUlp) & kTf32KeepMask;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// D (16x8, fp32) += A (16x8, tf32, row) * B (8x8, tf32, col).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 16-byte global -> shared copy; when `full` is false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool full) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = full ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Kernel 1: 3xTF32 tensor-core flash attention
// ---------------------------------------------------------------------------------------------
//
// Block = WARPS warps on BR = 16*MS*WARPS consecutive query rows of one (b, h); each warp owns
// MS slabs of 16 rows. Per key tile of BC keys: S = Q K^T (mma m16n8k8, A = Q slab, B = K^T),
// online softmax on the S fragments in registers, O += P V (A = P straight from the S fragments,
// B = V). The S accumulator holds columns (2t, 2t+1) of each n8 tile while the A operand wants
// columns (t, t+4): instead of shuffling, PV's k index is permuted (k = t <-> key 2t,
// k = t+4 <-> key 2t+1) and V's rows are read in that same order. Shared-memory rows are padded
// to D+4 words (= 4 mod 32), which makes both fragment patterns conflict-free.

// Where the Q operand lives: split into tf32 hi/lo once and kept in registers (2 x D/2 per
// thread), or in shared memory and split at every use (the path for D > 64 and 2-slab warps).
enum QMode { kQSplitRegs = 0, kQSmem = 1 };

constexpr int largest_divisor_upto(int n, int cap) {
  int d = cap < n ? cap : n;
  while (n % d != 0) --d;
  return d;
}

template <int D_, int WARPS_, int MS_, int BC_, int STAGES_, int QMODE_ = kQSplitRegs,
          int KSTAGE_ = 8, int MIN_BLOCKS_ = 1, int PV_CHUNK_ = 0>
struct MmaTile {
  static constexpr int D = D_;
  static constexpr int WARPS = WARPS_;
  static constexpr int MS = MS_;            // 16-row slabs per warp (K/V fragments reused MS times)
  static constexpr int BC = BC_;            // keys per tile
  static constexpr int STAGES = STAGES_;    // K/V shared-memory buffers in the cp.async pipeline
  static constexpr int QMODE = (MS > 1 || D > 64) ? kQSmem : QMODE_;
  static constexpr int NT = BC / 8;         // n8 tiles of S; k8 steps of PV
  static constexpr int KS = D / 8;          // k8 steps of QK^T; n8 tiles of O
  // K (resp. V) fragments loaded and split at a time, in n8 tiles: fewer live registers.
  static constexpr int KSTAGE = largest_divisor_upto(NT, KSTAGE_);
  static constexpr int VSTAGE = largest_divisor_upto(KS, KSTAGE_);
  static constexpr int MIN_BLOCKS = MIN_BLOCKS_;  // resident blocks per SM asked of the allocator
  // PV accumulation. 0: straight into O across the whole key loop. The tensor core truncates as
  // it accumulates, so over T/8 steps the error grows with T (measured: 9x the fp32 reference's
  // at T=1024, 14x at 2049), which is why every shipped shape uses > 0: each tile's PV goes into a
  // zeroed accumulator, PV_CHUNK n8 tiles of D at a time, merged as O = O*alpha + acc in fp32.
  static constexpr int PV_CHUNK = PV_CHUNK_ == 0 ? 0 : largest_divisor_upto(D / 8, PV_CHUNK_);
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int BR = 16 * MS * WARPS;
  static constexpr int STRIDE = D + 4;
  static constexpr int KV_FLOATS = STAGES * BC * STRIDE;
  static constexpr int Q_FLOATS = QMODE == kQSmem ? BR * STRIDE : 0;
  static constexpr int SMEM_BYTES = (2 * KV_FLOATS + Q_FLOATS) * static_cast<int>(sizeof(float));
  static_assert(D % 32 == 0, "padding D+4 is conflict-free only for D a multiple of 32");
  static_assert(BC % 8 == 0 && STAGES >= 2, "BC must be a multiple of 8, STAGES at least 2");
  static_assert(NT % KSTAGE == 0 && KS % VSTAGE == 0, "KSTAGE must divide BC/8 and D/8");
  static_assert(PV_CHUNK == 0 || KS % PV_CHUNK == 0, "PV_CHUNK must divide D/8");
  static_assert((BC * D / 4) % THREADS == 0, "K/V tile copy must divide evenly among threads");
  static_assert((BR * D / 4) % THREADS == 0, "Q tile copy must divide evenly among threads");
};

// Two query rows' S fragments of one key tile, in the mma.m16n8k8 / wgmma accumulator layout:
// s[n][e] is row row0 + 8 (e >> 1), key k0 + 8n + 2t + (e & 1). Keys after the row become -inf.
template <int NT>
__device__ __forceinline__ void mask_causal(float (&s)[NT][4], int k0, int row0, int t) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k0 + n * 8 + 2 * t + (e & 1);
      s[n][e] = key <= row0 + (e >> 1) * 8 ? s[n][e] : -INFINITY;
    }
}

// The online-softmax step of those two rows: the running maxima m (raw scores, reduced over the
// 4 threads of a row) and per-thread partial sums l are updated, s becomes exp2((s - m) *
// scale_log2), and alpha gets each row's rescale factor for what was accumulated before. The
// first tile holds key 0 <= every row, so m is finite from then on, and a tile wholly past a
// row leaves its maximum and adds exp2(-inf) = 0.
template <int NT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2], float scale_log2,
                                               float (&alpha)[2]) {
  float mx0 = m[0], mx1 = m[1];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(kFullMask, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(kFullMask, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(kFullMask, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(kFullMask, mx1, 2));
  alpha[0] = fast_exp2((m[0] - mx0) * scale_log2);
  alpha[1] = fast_exp2((m[1] - mx1) * scale_log2);
  m[0] = mx0;
  m[1] = mx1;
  const float nm0 = -mx0 * scale_log2, nm1 = -mx1 * scale_log2;
  float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    s[n][0] = fast_exp2(fmaf(s[n][0], scale_log2, nm0));
    s[n][1] = fast_exp2(fmaf(s[n][1], scale_log2, nm0));
    s[n][2] = fast_exp2(fmaf(s[n][2], scale_log2, nm1));
    s[n][3] = fast_exp2(fmaf(s[n][3], scale_log2, nm1));
    sum0 += s[n][0] + s[n][1];
    sum1 += s[n][2] + s[n][3];
  }
  l[0] = l[0] * alpha[0] + sum0;
  l[1] = l[1] * alpha[1] + sum1;
}

// P (the exp'd S fragments of n8 tile kt8) as PV's A operand: k = t <-> key 2t, k = t+4 <-> key 2t+1.
template <int MS, int NT>
__device__ __forceinline__ void split_p(const float (&s)[MS][NT][4], int kt8, uint32_t (&ph)[MS][4],
                                        uint32_t (&pl)[MS][4]) {
#pragma unroll
  for (int ms = 0; ms < MS; ++ms) {
    split_tf32(s[ms][kt8][0], ph[ms][0], pl[ms][0]);  // (row g,   key 2t)
    split_tf32(s[ms][kt8][2], ph[ms][1], pl[ms][1]);  // (row g+8, key 2t)
    split_tf32(s[ms][kt8][1], ph[ms][2], pl[ms][2]);  // (row g,   key 2t+1)
    split_tf32(s[ms][kt8][3], ph[ms][3], pl[ms][3]);  // (row g+8, key 2t+1)
  }
}

// V fragments of N n8 tiles of D from d-tile d0: b0 = V[key 2t][d*8+g], b1 = V[key 2t+1][d*8+g],
// `vr` pointing at V[key 2t][g] of the current key sub-tile.
template <int S, int N>
__device__ __forceinline__ void split_v(const float* vr, int d0, uint32_t (&vh)[N][2], uint32_t (&vl)[N][2]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    split_tf32(vr[(d0 + n) * 8], vh[n][0], vl[n][0]);
    split_tf32(vr[S + (d0 + n) * 8], vh[n][1], vl[n][1]);
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::THREADS, Tr::MIN_BLOCKS)
attention_kernel_mma(const float* __restrict__ qkv, float* __restrict__ y, int BH, int H, int T,
                     float scale_log2) {
  constexpr int D = Tr::D, BC = Tr::BC, BR = Tr::BR, S = Tr::STRIDE, NT = Tr::NT, KS = Tr::KS;
  constexpr int MS = Tr::MS, STAGES = Tr::STAGES, THREADS = Tr::THREADS;
  constexpr int QMODE = Tr::QMODE, KSTAGE = Tr::KSTAGE, VSTAGE = Tr::VSTAGE, PVC = Tr::PV_CHUNK;

  extern __shared__ __align__(16) float smem[];
  float* k_s = smem;                        // [STAGES][BC][S]
  float* v_s = smem + Tr::KV_FLOATS;        // [STAGES][BC][S]
  float* q_s = smem + 2 * Tr::KV_FLOATS;    // [BR][S] when QMODE == kQSmem

  const int C = H * D;
  const long rs = 3L * C;                   // qkv row stride
  const int n_qt = (T + BR - 1) / BR;
  const int bh = blockIdx.x % BH;
  const int qt = n_qt - 1 - static_cast<int>(blockIdx.x / BH);  // longest query tiles first
  const int b = bh / H, h = bh - b * H;
  const int q0 = qt * BR;
  const float* qg = qkv + static_cast<long>(b) * T * rs + h * D;
  const float* kg = qg + C;
  const float* vg = qg + 2 * C;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;    // mma fragment coordinates
  const int wrow = warp * MS * 16;          // first row of this warp in the block tile

  const int kv_end = min(q0 + BR, T);       // keys [0, kv_end) are needed
  const int n_kt = (kv_end + BC - 1) / BC;
  const int n_full = min(q0 / BC, n_kt);    // tiles whose keys all precede row q0: no mask

  auto load_kv = [&](int tile, int stage) {
    constexpr int CPR = D / 4;              // 16-byte chunks per row
    float* kd = k_s + stage * BC * S;
    float* vd = v_s + stage * BC * S;
    const int k0 = tile * BC;
#pragma unroll
    for (int it = 0; it < BC * CPR / THREADS; ++it) {
      const int c = tid + it * THREADS;
      const int r = c / CPR, col = (c % CPR) * 4;
      const int key = k0 + r;
      const bool ok = key < T;              // rows past T are zero-filled (V must be finite)
      const long off = static_cast<long>(ok ? key : 0) * rs + col;
      cp_async16(kd + r * S + col, kg + off, ok);
      cp_async16(vd + r * S + col, vg + off, ok);
    }
  };

  // Q fragments for the whole key loop (register modes) or the Q tile in shared memory.
  constexpr int QR = QMODE == kQSmem ? 1 : KS;
  uint32_t qh[QR][4], ql[QR][4];
  if constexpr (QMODE == kQSmem) {
    constexpr int CPR = D / 4;
#pragma unroll
    for (int it = 0; it < BR * CPR / THREADS; ++it) {
      const int c = tid + it * THREADS;
      const int r = c / CPR, col = (c % CPR) * 4;
      const int row = q0 + r;
      const bool ok = row < T;
      cp_async16(q_s + r * S + col, qg + static_cast<long>(ok ? row : 0) * rs + col, ok);
    }
  }
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < n_kt) load_kv(st, st);
    cp_async_commit();                      // group st (group 0 also holds the Q tile)
  }
  if constexpr (QMODE != kQSmem) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {         // a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
        const int row = q0 + wrow + g + (i & 1) * 8;
        const int col = kk * 8 + t + (i >> 1) * 4;
        const float x = row < T ? qg[static_cast<long>(row) * rs + col] : 0.f;
        split_tf32(x, qh[kk][i], ql[kk][i]);
      }
    }
  }

  float o[MS][KS][4];
  float m_run[MS][2], l_run[MS][2];         // running max (raw score) and per-thread partial sum
#pragma unroll
  for (int ms = 0; ms < MS; ++ms) {
#pragma unroll
    for (int dt = 0; dt < KS; ++dt) o[ms][dt][0] = o[ms][dt][1] = o[ms][dt][2] = o[ms][dt][3] = 0.f;
    m_run[ms][0] = m_run[ms][1] = -INFINITY;
    l_run[ms][0] = l_run[ms][1] = 0.f;
  }

  auto advance = [&](int j) {
    const int nx = j + STAGES - 1;
    if (nx < n_kt) load_kv(nx, nx % STAGES);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();            // tile j has landed
    __syncthreads();
  };

  auto tile = [&](int j, auto mask_tag) {
    constexpr bool MASK = decltype(mask_tag)::value;
    const int k0 = j * BC;
    if (MASK && k0 > q0 + wrow + MS * 16 - 1) return;  // every key after every row of this warp
    const float* kt = k_s + (j % STAGES) * BC * S;
    const float* vt = v_s + (j % STAGES) * BC * S;

    // S = Q K^T, three tf32 products per fp32 product (small terms first).
    float s[MS][NT][4];
#pragma unroll
    for (int ms = 0; ms < MS; ++ms)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[ms][nt][0] = s[ms][nt][1] = s[ms][nt][2] = s[ms][nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t ah[MS][4], al[MS][4];
#pragma unroll
      for (int ms = 0; ms < MS; ++ms) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (QMODE == kQSplitRegs) {
            ah[ms][i] = qh[kk][i];
            al[ms][i] = ql[kk][i];
          } else {
            const int r = wrow + ms * 16 + g + (i & 1) * 8;
            split_tf32(q_s[r * S + kk * 8 + t + (i >> 1) * 4], ah[ms][i], al[ms][i]);
          }
        }
      }
#pragma unroll
      for (int n0 = 0; n0 < NT; n0 += KSTAGE) {
        uint32_t bh[KSTAGE][2], bl[KSTAGE][2];  // b0 = K[key nt*8+g][d t], b1 = K[..][d t+4]
#pragma unroll
        for (int n = 0; n < KSTAGE; ++n) {
          const float* kr = kt + ((n0 + n) * 8 + g) * S + kk * 8 + t;
          split_tf32(kr[0], bh[n][0], bl[n][0]);
          split_tf32(kr[4], bh[n][1], bl[n][1]);
        }
#pragma unroll
        for (int ms = 0; ms < MS; ++ms)
#pragma unroll
          for (int n = 0; n < KSTAGE; ++n) mma_tf32(s[ms][n0 + n], al[ms], bh[n]);
#pragma unroll
        for (int ms = 0; ms < MS; ++ms)
#pragma unroll
          for (int n = 0; n < KSTAGE; ++n) mma_tf32(s[ms][n0 + n], ah[ms], bl[n]);
#pragma unroll
        for (int ms = 0; ms < MS; ++ms)
#pragma unroll
          for (int n = 0; n < KSTAGE; ++n) mma_tf32(s[ms][n0 + n], ah[ms], bh[n]);
      }
    }

    // Online softmax per 16-row slab (the fragment layout of mask_causal).
    float alpha[MS][2];
#pragma unroll
    for (int ms = 0; ms < MS; ++ms) {
      if constexpr (MASK) mask_causal<NT>(s[ms], k0, q0 + wrow + ms * 16 + g, t);
      online_softmax<NT>(s[ms], m_run[ms], l_run[ms], scale_log2, alpha[ms]);
      if constexpr (PVC == 0) {
#pragma unroll
        for (int dt = 0; dt < KS; ++dt) {
          o[ms][dt][0] *= alpha[ms][0];
          o[ms][dt][1] *= alpha[ms][0];
          o[ms][dt][2] *= alpha[ms][1];
          o[ms][dt][3] *= alpha[ms][1];
        }
      }
    }

    // O += P V. A = P with k index t <-> key 2t, t+4 <-> key 2t+1; B = V rows in that order.
    if constexpr (PVC == 0) {
#pragma unroll
      for (int kt8 = 0; kt8 < NT; ++kt8) {
        uint32_t ph[MS][4], pl[MS][4];
        split_p(s, kt8, ph, pl);
        const float* vr = vt + (kt8 * 8 + 2 * t) * S + g;
#pragma unroll
        for (int d0 = 0; d0 < KS; d0 += VSTAGE) {
          uint32_t vh[VSTAGE][2], vl[VSTAGE][2];  // b0 = V[key 2t][d dt*8+g], b1 = V[key 2t+1][..]
          split_v<S>(vr, d0, vh, vl);
          // Three passes (small terms first) so that no MMA waits on the one just issued.
#pragma unroll
          for (int ms = 0; ms < MS; ++ms)
#pragma unroll
            for (int n = 0; n < VSTAGE; ++n) mma_tf32(o[ms][d0 + n], pl[ms], vh[n]);
#pragma unroll
          for (int ms = 0; ms < MS; ++ms)
#pragma unroll
            for (int n = 0; n < VSTAGE; ++n) mma_tf32(o[ms][d0 + n], ph[ms], vl[n]);
#pragma unroll
          for (int ms = 0; ms < MS; ++ms)
#pragma unroll
            for (int n = 0; n < VSTAGE; ++n) mma_tf32(o[ms][d0 + n], ph[ms], vh[n]);
        }
      }
    } else {
#pragma unroll
      for (int c0 = 0; c0 < KS; c0 += PVC) {   // PVC n8 tiles of D per zeroed accumulator
        float acc[MS][PVC][4];
#pragma unroll
        for (int ms = 0; ms < MS; ++ms)
#pragma unroll
          for (int n = 0; n < PVC; ++n) acc[ms][n][0] = acc[ms][n][1] = acc[ms][n][2] = acc[ms][n][3] = 0.f;
#pragma unroll
        for (int kt8 = 0; kt8 < NT; ++kt8) {
          uint32_t ph[MS][4], pl[MS][4];
          split_p(s, kt8, ph, pl);
          const float* vr = vt + (kt8 * 8 + 2 * t) * S + g;
          uint32_t vh[PVC][2], vl[PVC][2];
          split_v<S>(vr, c0, vh, vl);
#pragma unroll
          for (int ms = 0; ms < MS; ++ms)
#pragma unroll
            for (int n = 0; n < PVC; ++n) mma_tf32(acc[ms][n], pl[ms], vh[n]);
#pragma unroll
          for (int ms = 0; ms < MS; ++ms)
#pragma unroll
            for (int n = 0; n < PVC; ++n) mma_tf32(acc[ms][n], ph[ms], vl[n]);
#pragma unroll
          for (int ms = 0; ms < MS; ++ms)
#pragma unroll
            for (int n = 0; n < PVC; ++n) mma_tf32(acc[ms][n], ph[ms], vh[n]);
        }
#pragma unroll
        for (int ms = 0; ms < MS; ++ms)
#pragma unroll
          for (int n = 0; n < PVC; ++n) {
            o[ms][c0 + n][0] = fmaf(o[ms][c0 + n][0], alpha[ms][0], acc[ms][n][0]);
            o[ms][c0 + n][1] = fmaf(o[ms][c0 + n][1], alpha[ms][0], acc[ms][n][1]);
            o[ms][c0 + n][2] = fmaf(o[ms][c0 + n][2], alpha[ms][1], acc[ms][n][2]);
            o[ms][c0 + n][3] = fmaf(o[ms][c0 + n][3], alpha[ms][1], acc[ms][n][3]);
          }
      }
    }
  };

  int j = 0;
  for (; j < n_full; ++j) {                 // hot loop: no mask
    advance(j);
    tile(j, std::false_type{});
    __syncthreads();                        // stage j % STAGES is refilled next
  }
  for (; j < n_kt; ++j) {                   // tiles that cross the diagonal
    advance(j);
    tile(j, std::true_type{});
    __syncthreads();
  }

#pragma unroll
  for (int ms = 0; ms < MS; ++ms) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = l_run[ms][i];
      l += __shfl_xor_sync(kFullMask, l, 1);
      l += __shfl_xor_sync(kFullMask, l, 2);
      const int row = q0 + wrow + ms * 16 + g + i * 8;
      if (row < T) {
        float* yr = y + (static_cast<long>(b) * T + row) * C + h * D + 2 * t;
#pragma unroll
        for (int dt = 0; dt < KS; ++dt) {
          *reinterpret_cast<float2*>(yr + dt * 8) =
              make_float2(o[ms][dt][2 * i] / l, o[ms][dt][2 * i + 1] / l);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2: generic head size
// ---------------------------------------------------------------------------------------------
//
// One warp per (b, h, query row), lane d-strided. R > 0: the row's q and output accumulator live
// in R registers per lane (D <= 32 R). R == 0: any D, the output row in y is the accumulator
// (each lane only ever touches its own elements of it).
constexpr int kGenericWarps = 4;

template <int R>
__global__ void __launch_bounds__(32 * kGenericWarps)
attention_kernel_generic(const float* __restrict__ qkv, float* __restrict__ y, int BH, int H, int T,
                         int D, float scale_log2) {
  const int lane = threadIdx.x & 31;
  const long gw = static_cast<long>(blockIdx.x) * kGenericWarps + (threadIdx.x >> 5);
  if (gw >= static_cast<long>(BH) * T) return;  // whole warps only
  const int i = T - 1 - static_cast<int>(gw / BH);  // longest rows first
  const int bh = static_cast<int>(gw % BH);
  const int b = bh / H, h = bh - b * H;
  const int C = H * D;
  const long rs = 3L * C;
  const float* q = qkv + (static_cast<long>(b) * T + i) * rs + static_cast<long>(h) * D;
  const float* kbase = qkv + static_cast<long>(b) * T * rs + C + static_cast<long>(h) * D;
  const float* vbase = kbase + C;
  float* yr = y + (static_cast<long>(b) * T + i) * C + static_cast<long>(h) * D;

  float m = -INFINITY, l = 0.f;
  if constexpr (R > 0) {
    float qr[R], o[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = lane + 32 * r;
      qr[r] = d < D ? q[d] : 0.f;
      o[r] = 0.f;
    }
    for (int j = 0; j <= i; ++j) {
      const float* kj = kbase + static_cast<long>(j) * rs;
      const float* vj = vbase + static_cast<long>(j) * rs;
      float part = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int d = lane + 32 * r;
        if (d < D) part = fmaf(qr[r], kj[d], part);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(kFullMask, part, off);
      const float mn = fmaxf(m, part);
      const float alpha = fast_exp2((m - mn) * scale_log2);
      const float p = fast_exp2((part - mn) * scale_log2);
      l = l * alpha + p;
      m = mn;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int d = lane + 32 * r;
        if (d < D) o[r] = fmaf(p, vj[d], o[r] * alpha);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int d = lane + 32 * r;
      if (d < D) yr[d] = o[r] / l;
    }
  } else {
    for (int d = lane; d < D; d += 32) yr[d] = 0.f;
    for (int j = 0; j <= i; ++j) {
      const float* kj = kbase + static_cast<long>(j) * rs;
      const float* vj = vbase + static_cast<long>(j) * rs;
      float part = 0.f;
      for (int d = lane; d < D; d += 32) part = fmaf(q[d], kj[d], part);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(kFullMask, part, off);
      const float mn = fmaxf(m, part);
      const float alpha = fast_exp2((m - mn) * scale_log2);
      const float p = fast_exp2((part - mn) * scale_log2);
      l = l * alpha + p;
      m = mn;
      for (int d = lane; d < D; d += 32) yr[d] = fmaf(p, vj[d], yr[d] * alpha);
    }
    for (int d = lane; d < D; d += 32) yr[d] = yr[d] / l;
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 3: warp-specialised 3xTF32 flash attention on Hopper's wgmma (sm_90a, D = 64)
// ---------------------------------------------------------------------------------------------
//
// Block = 3 warpgroups; a work item is one (b, h, 128-row query tile), items longest first.
// Warpgroup 0, the producer: one thread has TMA bring each raw K/V tile (64 keys; a 3-D tensor
// map over qkv, 128-byte swizzle, rows past T zero-filled) into one of two staging buffers, and
// each item's Q tile into its own buffer; all 128 threads split each staged tile into a ring of
// SPLIT_STAGES split tiles of four 16 KB wgmma B operands:
//   K_hi, K_lo   [key][d], K-major in the 128-byte swizzle (the layout TMA delivered: split in place),
//   V^T_hi, V^T_lo [d][position], V transposed (tf32 wgmma reads B K-major only) with the keys of
//                each group of 8 permuted (position t <-> key 2t, t+4 <-> key 2t+1) so that P goes
//                from the S accumulators into PV's A registers without a shuffle.
// Warpgroups 1 and 2, the consumers, own 64 query rows each. Q is split into hi/lo A fragments
// once per item (64 registers for the whole key loop); per key tile each issues
//   S  = Q K^T: 8 k8 slices x 3 wgmma.m64n64k8 (small terms first),
//   the online softmax on the S accumulators (masked only on tiles that cross its diagonal),
//   O' = P V:   8 k8 slices x 3 wgmma.m64n64k8 into a zeroed accumulator, O = O * alpha + O'
//   (per-tile PV accumulation: the tensor cores' fp32 accumulation truncates, see kernel 1).
// No block-wide barrier: mbarriers hand over the ring slots (full: 128 producer arrivals after
// the split stores and their proxy fence; empty: 8 consumer warps after their PV wgmmas), the
// staging buffers and the Q buffer, so one consumer's softmax overlaps the other's wgmmas and the
// split runs beside both. The first consumer stops at its own diagonal: the item's last 64-key
// tile is wholly masked for its rows (it hands that slot back unread).
// Persistent grid, G = one block per SM: block b takes items b, 2G-1-b, 2G+b, ... (a snake over
// the rounds, which evens out the triangle's item lengths: 98.9% balance at the canonical shape,
// 93% for plain round robin), and the producer runs ahead into the next item, so no block
// prologue is exposed after the first (one block per item, the hardware's schedule, was 8% slower).
// Shared memory: 2 x 64 KB split tiles + 2 x 32 KB staging + 32 KB Q = 224 KB; 1 block per SM.
struct WsTile {
  static constexpr int D = 64, BR = 128, BC = 64;
  static constexpr int BOX_COLS = 32;                 // TMA box: 32 floats (one swizzle row) x BC rows
  static constexpr int CONSUMERS = 2;                 // consumer warpgroups, 64 query rows each
  static constexpr int THREADS = 128 * (1 + CONSUMERS);
  static constexpr int SPLIT_STAGES = 2;              // ring of split K/V tiles (64 KB each)
  static constexpr int PRODUCER_REGS = 40;            // setmaxnreg: 40 + 2 x 232 per 3 x 128 threads
  static constexpr int CONSUMER_REGS = 232;
  static constexpr int SPLIT_BYTES = 4 * BC * D * 4;  // K_hi, K_lo, Vt_hi, Vt_lo: 16 KB each
  static constexpr int RAW_BYTES = 2 * BC * D * 4;    // raw K | V of one tile: [d / 32][key][32 d], swizzled
  static constexpr int Q_BYTES = BR * D * 4;          // raw Q of an item: [d / 32][row][32 d], swizzled
  static constexpr int BARRIERS = 2 * SPLIT_STAGES + 2 + 2;  // full[], empty[], raw_full[2], q_full, q_empty
  static constexpr int SMEM_BYTES = 1024 + SPLIT_STAGES * SPLIT_BYTES + 2 * RAW_BYTES + Q_BYTES + 8 * BARRIERS;
  static constexpr int PRODUCER_BAR = 1;              // named barrier of the producer warpgroup
  enum : uint32_t { K_HI = 0, K_LO = 16384, VT_HI = 32768, VT_LO = 49152 };
  static_assert(SMEM_BYTES <= 232448, "over the 227 KB a block may have");
  static_assert(128 * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= 65536, "over the register file");
};

__global__ void __launch_bounds__(WsTile::THREADS, 1)
attention_kernel_ws(const __grid_constant__ CUtensorMap map_qkv, float* __restrict__ y, int BH, int H, int T,
                    float scale_log2) {
#if defined(HOPPER_WGMMA)  // elsewhere never launched: the launcher probes the device first
  using Tr = WsTile;
  constexpr int D = Tr::D, BR = Tr::BR, BC = Tr::BC, NS = Tr::SPLIT_STAGES;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = hopper::align_smem_1024(smem_raw);
  const uint32_t split_s = hopper::smem_u32(base);                     // [NS][64 KB]
  unsigned char* raw = base + NS * Tr::SPLIT_BYTES;                    // [2][32 KB]
  unsigned char* q_s = raw + 2 * Tr::RAW_BYTES;                        // [32 KB]
  const uint32_t raw_s = hopper::smem_u32(raw), q_addr = hopper::smem_u32(q_s);
  const uint32_t bars = q_addr + Tr::Q_BYTES;
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (NS + s); };
  auto raw_full = [&](int st) { return bars + 8 * (2 * NS + st); };
  const uint32_t q_full = bars + 8 * (2 * NS + 2), q_empty = q_full + 8;

  const int C = H * D;
  const int n_qt = (T + BR - 1) / BR;
  const int n_items = n_qt * BH;
  const int G = static_cast<int>(gridDim.x);
  // Round r's item of this block (-1 past the end; once -1, every later round is too).
  auto item_of = [&](int r) {
    const int i = r * G + ((r & 1) ? G - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x));
    return i < n_items ? i : -1;
  };
  // Item i: query tile n_qt - 1 - i / BH (longest first) of (b, h) = i % BH.
  auto item_q0 = [&](int i) { return (n_qt - 1 - i / BH) * BR; };
  auto item_tiles = [&](int i) { return (min(item_q0(i) + BR, T) + BC - 1) / BC; };

  // The warpgroup index through a shuffle: the compiler then knows it (and every loop count and
  // ring position derived from it) is warp-uniform, and keeps the wgmma descriptors in uniform
  // registers (as CUTLASS's canonical_warp_group_idx does); 80 bytes spilled without it.
  const int tid = threadIdx.x, wg = __shfl_sync(kFullMask, tid >> 7, 0);
  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      hopper::mbar_init(full(s), 128);                 // every producer thread, after its split stores
      hopper::mbar_init(empty(s), 4 * Tr::CONSUMERS);  // every consumer warp, after its PV wgmmas
    }
    hopper::mbar_init(raw_full(0), 1);                 // TMA transactions
    hopper::mbar_init(raw_full(1), 1);
    hopper::mbar_init(q_full, 1);
    hopper::mbar_init(q_empty, 4 * Tr::CONSUMERS);
    hopper::mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::PRODUCER_REGS) : "memory");
    int cur = item_of(0);
    if (cur < 0) return;
    // Coordinates in map_qkv: (column of qkv's last axis, t, b).
    auto load_q = [&](int i) {
      const int bh = i % BH, b = bh / H, h = bh - b * H;
      hopper::mbar_expect_tx(q_full, Tr::Q_BYTES);
      for (int blk = 0; blk < D / Tr::BOX_COLS; ++blk)
        for (int half = 0; half < BR / BC; ++half)  // boxes of BC rows
          hopper::tma_load_3d(q_addr + blk * BR * 128 + half * BC * 128, &map_qkv, h * D + blk * Tr::BOX_COLS,
                              item_q0(i) + half * BC, b, q_full);
    };
    auto load_kv = [&](int i, int tile, int st) {
      const int bh = i % BH, b = bh / H, h = bh - b * H;
      const uint32_t dst = raw_s + st * Tr::RAW_BYTES;
      hopper::mbar_expect_tx(raw_full(st), Tr::RAW_BYTES);
      for (int m = 0; m < 2; ++m)  // K, V
        for (int blk = 0; blk < D / Tr::BOX_COLS; ++blk)
          hopper::tma_load_3d(dst + (2 * m + blk) * BC * 128, &map_qkv, (1 + m) * C + h * D + blk * Tr::BOX_COLS,
                              tile * BC, b, raw_full(st));
    };
    auto split = [&](int st, int s) {  // ends with the slot announced full
      const unsigned char* ks = raw + st * Tr::RAW_BYTES;
      const float* vs = reinterpret_cast<const float*>(ks + BC * D * 4);
      unsigned char* dst = base + s * Tr::SPLIT_BYTES;
#pragma unroll 2
      for (int it = 0; it < BC * D / 4 / 128; ++it) {  // K: the same swizzled layout in and out
        const uint32_t off = (tid + it * 128) * 16;
        const float4 v = *reinterpret_cast<const float4*>(ks + off);
        uint32_t hi[4], lo[4];
        hopper::split_tf32(v.x, hi[0], lo[0]);
        hopper::split_tf32(v.y, hi[1], lo[1]);
        hopper::split_tf32(v.z, hi[2], lo[2]);
        hopper::split_tf32(v.w, hi[3], lo[3]);
        *reinterpret_cast<uint4*>(dst + Tr::K_HI + off) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4*>(dst + Tr::K_LO + off) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      }
#pragma unroll 2
      for (int it = 0; it < BC * D / 4 / 128; ++it) {  // V: keys 2e + par of group grp, column d -> V^T
        const int c = tid + it * 128, d = c & (D - 1), q = c / D, grp = q >> 1, par = q & 1;
        const float* vcol = vs + (d / 32) * (BC * 32);
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = grp * 8 + 2 * e + par;
          hopper::split_tf32(vcol[hopper::sw128_offset(key, d % 32) / 4], hi[e], lo[e]);
        }
        const int pos = grp * 8 + par * 4;
        const uint32_t off = (pos / 32) * 8192 + hopper::sw128_offset(d, pos % 32);
        *reinterpret_cast<uint4*>(dst + Tr::VT_HI + off) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4*>(dst + Tr::VT_LO + off) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      }
      hopper::fence_proxy_async();
      hopper::mbar_arrive(full(s));
    };
    if (tid == 0) {
      hopper::prefetch_tensormap(&map_qkv);
      load_q(cur);
      load_kv(cur, 0, 0);
    }
    uint32_t it = 0;  // tiles split so far over all items: the ring position
    for (int r = 0, k = 0; cur >= 0; ++r, ++k) {
      const int nxt = item_of(r + 1);
      const int n_kt = item_tiles(cur);
      for (int j = 0; j < n_kt; ++j, ++it) {
        hopper::named_sync(Tr::PRODUCER_BAR, 128);  // every producer thread is done with staging (it + 1) % 2
        if (tid == 0) {
          if (j + 1 < n_kt) {
            load_kv(cur, j + 1, (it + 1) & 1);
          } else if (nxt >= 0) {
            hopper::mbar_wait(q_empty, k & 1);  // both consumers have read this item's Q
            load_q(nxt);
            load_kv(nxt, 0, (it + 1) & 1);
          }
        }
        hopper::mbar_wait(raw_full(it & 1), (it >> 1) & 1);  // tile it staged
        const int s = it % NS;
        if (it >= NS) hopper::mbar_wait(empty(s), ((it / NS) - 1) & 1);
        split(it & 1, s);
      }
      cur = nxt;
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::CONSUMER_REGS) : "memory");
  const int c = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int lrow = c * 64 + warp * 16 + g;  // this thread's rows in the item: lrow and lrow + 8
  const float* qf = reinterpret_cast<const float*>(q_s);
  uint32_t it = 0;
  for (int r = 0, k = 0;; ++r, ++k) {
    const int cur = item_of(r);
    if (cur < 0) break;
    const int q0 = item_q0(cur), n_kt = item_tiles(cur);
    const int wg_row0 = q0 + c * 64, row0 = q0 + lrow;
    // Key tiles this warpgroup computes: up to its diagonal (none when all its rows are past T).
    const int n_c = wg_row0 < T ? (min(wg_row0 + 64, T) + BC - 1) / BC : 0;

    // Q fragments for the whole key loop: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4).
    hopper::mbar_wait(q_full, k & 1);
    uint32_t qh[D / 8][4], ql[D / 8][4];
#pragma unroll
    for (int kk = 0; kk < D / 8; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rr = lrow + (i & 1) * 8, col = kk * 8 + t + (i >> 1) * 4;
        hopper::split_tf32(qf[(col / 32) * (BR * 32) + hopper::sw128_offset(rr, col % 32) / 4], qh[kk][i], ql[kk][i]);
      }
    }
    __syncwarp();
    if (lane == 0) hopper::mbar_arrive(q_empty);

    float o[D / 2], op[D / 2], s[BC / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    int j = 0;
    for (; j < n_c; ++j, ++it) {
      const int st = it % NS;
      const uint32_t tile_s = split_s + st * Tr::SPLIT_BYTES;
      hopper::mbar_wait(full(st), (it / NS) & 1);
      const int k0 = j * BC;

      // S = Q K^T (small terms first).
      hopper::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 8; ++kk) {
        const uint32_t at = tile_s + (kk / 4) * 8192 + (kk % 4) * 32;
        hopper::wgmma_3xtf32<BC>(s, qh[kk], ql[kk], hopper::sw128_desc(at + Tr::K_HI),
                                 hopper::sw128_desc(at + Tr::K_LO), kk > 0);
      }
      hopper::wgmma_commit();
      hopper::wgmma_wait_all();

      auto& sf = reinterpret_cast<float (&)[BC / 8][4]>(s);
      if (k0 + BC - 1 > wg_row0) mask_causal<BC / 8>(sf, k0, row0, t);  // the tile crosses the diagonal
      float alpha[2];
      online_softmax<BC / 8>(sf, m_run, l_run, scale_log2, alpha);
      // The row sums are done before the PV batch is issued (left to itself, the scheduler sinks
      // them below it and keeps the exp'd scores alive through the wgmmas: spills).
      asm volatile("" : "+f"(l_run[0]), "+f"(l_run[1]));

      // O' = P V: A = P with position t <-> key 2t, t+4 <-> key 2t+1 (V^T's order).
      uint32_t ph[BC / 8][4], pl[BC / 8][4];
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) {
        hopper::split_tf32(s[4 * n], ph[n][0], pl[n][0]);      // (g,   key 2t)
        hopper::split_tf32(s[4 * n + 2], ph[n][1], pl[n][1]);  // (g+8, key 2t)
        hopper::split_tf32(s[4 * n + 1], ph[n][2], pl[n][2]);  // (g,   key 2t+1)
        hopper::split_tf32(s[4 * n + 3], ph[n][3], pl[n][3]);  // (g+8, key 2t+1)
      }
      hopper::wgmma_fence();
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) {
        const uint32_t at = tile_s + (n / 4) * 8192 + (n % 4) * 32;
        hopper::wgmma_3xtf32<D>(op, ph[n], pl[n], hopper::sw128_desc(at + Tr::VT_HI),
                                hopper::sw128_desc(at + Tr::VT_LO), n > 0);
      }
      hopper::wgmma_commit();
      hopper::wgmma_wait_all();
      __syncwarp();
      if (lane == 0) hopper::mbar_arrive(empty(st));  // this warp's reads of the slot are done
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[4 * n] = fmaf(o[4 * n], alpha[0], op[4 * n]);
        o[4 * n + 1] = fmaf(o[4 * n + 1], alpha[0], op[4 * n + 1]);
        o[4 * n + 2] = fmaf(o[4 * n + 2], alpha[1], op[4 * n + 2]);
        o[4 * n + 3] = fmaf(o[4 * n + 3], alpha[1], op[4 * n + 3]);
      }
    }
    for (; j < n_kt; ++j, ++it) {  // tiles past this warpgroup's rows: hand the slot back unread
      const int st = it % NS;
      hopper::mbar_wait(full(st), (it / NS) & 1);
      __syncwarp();
      if (lane == 0) hopper::mbar_arrive(empty(st));
    }
    if (n_c == 0) continue;

    l_run[0] += __shfl_xor_sync(kFullMask, l_run[0], 1);
    l_run[0] += __shfl_xor_sync(kFullMask, l_run[0], 2);
    l_run[1] += __shfl_xor_sync(kFullMask, l_run[1], 1);
    l_run[1] += __shfl_xor_sync(kFullMask, l_run[1], 2);
    const float inv0 = 1.f / l_run[0], inv1 = 1.f / l_run[1];
    const int bh = cur % BH, b = bh / H, h = bh - b * H;
    float* yb = y + static_cast<long>(b) * T * C + h * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int col = n * 8 + 2 * t;
      if (row0 < T)
        *reinterpret_cast<float2*>(yb + static_cast<long>(row0) * C + col) =
            make_float2(o[4 * n] * inv0, o[4 * n + 1] * inv0);
      if (row0 + 8 < T)
        *reinterpret_cast<float2*>(yb + static_cast<long>(row0 + 8) * C + col) =
            make_float2(o[4 * n + 2] * inv1, o[4 * n + 3] * inv1);
    }
  }
#endif  // HOPPER_WGMMA
}

// ---------------------------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------------------------

template <class Tr>
cudaError_t launch_mma(const float* qkv, float* y, int B, int T, int H, float scale_log2,
                       cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = hopper::allow_dynamic_smem_once<attention_kernel_mma<Tr>>(device, Tr::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  const long blocks = static_cast<long>((T + Tr::BR - 1) / Tr::BR) * B * H;
  attention_kernel_mma<Tr><<<static_cast<unsigned>(blocks), Tr::THREADS, Tr::SMEM_BYTES, stream>>>(
      qkv, y, B * H, H, T, scale_log2);
  return cudaGetLastError();
}

template <int R>
cudaError_t launch_generic_r(const float* qkv, float* y, int B, int T, int H, int D, float scale_log2,
                             cudaStream_t stream) {
  const long warps = static_cast<long>(B) * H * T;
  const long blocks = (warps + kGenericWarps - 1) / kGenericWarps;
  attention_kernel_generic<R><<<static_cast<unsigned>(blocks), 32 * kGenericWarps, 0, stream>>>(
      qkv, y, B * H, H, T, D, scale_log2);
  return cudaGetLastError();
}

cudaError_t launch_generic(const float* qkv, float* y, int B, int T, int H, int D, float scale_log2,
                           cudaStream_t stream) {
  if (D <= 32) return launch_generic_r<1>(qkv, y, B, T, H, D, scale_log2, stream);
  if (D <= 64) return launch_generic_r<2>(qkv, y, B, T, H, D, scale_log2, stream);
  if (D <= 128) return launch_generic_r<4>(qkv, y, B, T, H, D, scale_log2, stream);
  if (D <= 256) return launch_generic_r<8>(qkv, y, B, T, H, D, scale_log2, stream);
  if (D <= 512) return launch_generic_r<16>(qkv, y, B, T, H, D, scale_log2, stream);
  if (D <= 1024) return launch_generic_r<32>(qkv, y, B, T, H, D, scale_log2, stream);
  return launch_generic_r<0>(qkv, y, B, T, H, D, scale_log2, stream);
}

// The tile shape per head size (ThunderKittens style):
//   MmaTile<D, warps, 16-row slabs per warp, keys per tile, stages, Q mode, K/V staging,
//           min blocks, PV chunk>
// D = 64 (GPT-2): 2 slabs per warp so that each K/V fragment feeds 32 rows, 32-key tiles in a
// 3-stage pipeline, a zeroed per-tile PV accumulator (error flat in T); 242 registers, the
// fastest of 11 shapes measured on the H200 (benchmarks/results/2026-11-30-attention-mma-sync.md
// keeps the others' numbers).
using Mma32 = MmaTile<32, 4, 1, 64, 2, kQSplitRegs, 8, 1, 4>;
using Mma64 = MmaTile<64, 4, 2, 32, 3, kQSmem, 8, 1, 8>;
using Mma96 = MmaTile<96, 4, 1, 32, 2, kQSmem, 8, 1, 4>;
using Mma128 = MmaTile<128, 4, 1, 32, 2, kQSmem, 8, 1, 4>;

cudaError_t launch_tensor_core(const float* qkv, float* y, int B, int T, int H, int D, float scale_log2,
                               cudaStream_t stream) {
  switch (D) {
    case 32: return launch_mma<Mma32>(qkv, y, B, T, H, scale_log2, stream);
    case 64: return launch_mma<Mma64>(qkv, y, B, T, H, scale_log2, stream);
    case 96: return launch_mma<Mma96>(qkv, y, B, T, H, scale_log2, stream);
    case 128: return launch_mma<Mma128>(qkv, y, B, T, H, scale_log2, stream);
    default: return launch_generic(qkv, y, B, T, H, D, scale_log2, stream);
  }
}

// qkv (B, T, 3C) as a 3-D TMA map (3C, T, B): boxes of 32 floats x `box_rows` rows x 1, the
// 128-byte swizzle, zero fill past T.
bool make_qkv_map(CUtensorMap* map, const float* qkv, int B, int T, int C, int box_rows) {
  const auto encode = hopper::tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(3L * C), static_cast<cuuint64_t>(T),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(3L * C) * sizeof(float),
                                 static_cast<cuuint64_t>(3L * C) * T * sizeof(float)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(WsTile::BOX_COLS), static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t step[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(qkv), dims, strides, box, step,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// One block per SM (or per item, when there are fewer items), each walking its items.
cudaError_t launch_ws(const float* qkv, float* y, int B, int T, int H, float scale_log2, cudaStream_t stream) {
  using Tr = WsTile;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = hopper::allow_dynamic_smem_once<attention_kernel_ws>(device, Tr::SMEM_BYTES);
  if (err != cudaSuccess) return err;
  const long items = static_cast<long>((T + Tr::BR - 1) / Tr::BR) * B * H;
  if (items >= (1L << 31)) return cudaErrorInvalidValue;
  int sms = 0;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
  const long blocks = items < sms ? items : sms;
  CUtensorMap map{};
  if (!make_qkv_map(&map, qkv, B, T, H * Tr::D, Tr::BC)) return cudaErrorNotSupported;
  attention_kernel_ws<<<static_cast<unsigned>(blocks), Tr::THREADS, Tr::SMEM_BYTES, stream>>>(
      map, y, B * H, H, T, scale_log2);
  return cudaGetLastError();
}

bool wgmma_runs(int D, cudaStream_t stream) {
  int device = 0;
  return D == WsTile::D && cudaGetDevice(&device) == cudaSuccess && hopper::device_has_sm90a(device, stream);
}

}  // namespace

// config (kAttentionConfigs in attention.h): kAttentionTensorCore = the warp-specialised wgmma
// kernel for D = 64 on an sm_90a image, else the mma.sync kernel for head sizes 32, 64, 96 and 128
// (any other head size, and misaligned pointers, take the generic path); kAttentionGeneric = the
// generic path for every shape (slow, the fallback); kAttentionMmaSync = as config 0 without the
// wgmma kernel.
extern "C" cudaError_t attention_launcher(const float* qkv, float* y, int B, int T, int H, int D,
                                          int config, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || H <= 0 || D <= 0 || config < 0 || config >= kAttentionConfigs) {
    return cudaErrorInvalidValue;
  }
  const float scale_log2 = static_cast<float>(kLog2e / std::sqrt(static_cast<double>(D)));
  const bool aligned = reinterpret_cast<uintptr_t>(qkv) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (config == kAttentionGeneric || !aligned) return launch_generic(qkv, y, B, T, H, D, scale_log2, stream);
  if (config == kAttentionTensorCore && wgmma_runs(D, stream)) {
    return launch_ws(qkv, y, B, T, H, scale_log2, stream);
  }
  return launch_tensor_core(qkv, y, B, T, H, D, scale_log2, stream);
}
