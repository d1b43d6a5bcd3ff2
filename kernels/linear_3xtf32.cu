// linear_3xtf32.cu: nn.Linear forward, y = x W^T + b, on Hopper's wgmma tensor cores at float32
// accuracy (3xTF32), with TMA loads in a warp-specialised multi-stage pipeline.
//
// 3xTF32: each fp32 operand is split into a tf32 high part and the residual, x = hi + lo, and
// x.w ~ hi(x) hi(w) + hi(x) lo(w) + lo(x) hi(w) (the lo.lo term, ~2^-22 relative, is dropped):
// three tf32 tensor-core products per fp32 product, summed on the tensor cores over short runs
// of K and across them in fp32 registers (the tensor cores' own accumulation does not round to
// nearest; over all of K it gave 11x the fp32 SGEMM's error).
//   - W is split once per call by a small kernel (W_hi | W_lo, 2 x N x K floats, 2-3 us at GPT-2
//     sizes) into a buffer the binding allocates; wgmma reads B operands from shared memory only.
//   - x is read raw by TMA; the consumer warps load their A fragments from shared memory into
//     registers and split them there (wgmma takes A from registers), so x is never copied.
//
// Block: 3 warpgroups. Warpgroup 0 is the producer (one thread issues the TMA loads of the x,
// W_hi and W_lo tiles of each k-step into a STAGES-deep ring, mbarrier-tracked); warpgroups 1
// and 2 each own 64 rows of the 128 x BN output tile and issue, per k8 step, three
// wgmma.m64nBNk8 (A = x_hi or x_lo from registers, B = W_lo or W_hi from shared memory), taking
// turns with each other. Tiles are 128 x BN x 32 (32 floats = one 128-byte swizzle row, the TMA
// box and wgmma's SW128 K-major layout); a persistent grid (one block per SM) walks the tiles.
// The fp32 accumulator starts from the bias; the epilogue stores straight from the accumulators.
//
// Napkin math, GPT-2 small at B*T = 16384 rows, K = 768 (H200, ~411 TFLOP/s tf32 measured):
//   c_attn (N = 2304): 58.0 GFLOP x 3 products = 174 GFLOP -> 0.42 ms at the tf32 ceiling;
//   c_proj (N =  768): 19.3 x 3 = 58 GFLOP                  -> 0.14 ms.
//   Per k-step and block (BN = 128): TMA brings 16 KB of x and 2 x 16 KB of W for 1.57 M tf32
//   FMAs (~1536 cycles at 1024 FMA/cycle/SM): 32 B/cycle from L2; the wgmmas read W_hi twice and
//   W_lo once per warpgroup from shared memory, 64 B/cycle at the tensor cores' peak.
//   Measured (H200, config 0): c_attn 445 us, c_proj 157 us (391 and 369 TFLOP/s of tf32 work,
//   95% and 90% of the ~411 measured; ncu: tensor pipe active 85% of cycles); cuBLASLt's fp32
//   SGEMM (the fallback): 1.17 ms and 392 us.
//   benchmarks/results/2026-12-01-wgmma-gemm-and-attention.md has every version.
//
// Requirements (else the launcher returns cudaErrorNotSupported and the binding falls back to
// cuBLASLt's fp32 SGEMM): a device image built for sm_90a (probed once per device), K and N
// multiples of 4, x, W and y 16-byte aligned, bias 8-byte aligned, M < 2^23.
#include "linear_3xtf32.h"

#include "hopper.h"

#include <cuda_runtime.h>

#include <cstdint>

using namespace hopper;

namespace {

constexpr int kBM = 128;          // output rows per block (2 consumer warpgroups x 64)
constexpr int kBK = 32;           // k per stage: 32 floats = one 128-byte swizzle row
constexpr int kConsumers = 2;     // consumer warpgroups
constexpr int kThreads = 128 * (1 + kConsumers);

template <int BN_, int STAGES_, int PROMOTE_>
struct Tile {
  static constexpr int BN = BN_;
  static constexpr int STAGES = STAGES_;
  static constexpr int PROMOTE = PROMOTE_;  // k-steps summed on the tensor cores per fp32 add
  static_assert(PROMOTE >= 1, "at least one k-step per fp32 add");
  static constexpr int A_BYTES = kBM * kBK * 4;
  static constexpr int B_BYTES = BN * kBK * 4;           // one of W_hi, W_lo
  static constexpr int STAGE_BYTES = A_BYTES + 2 * B_BYTES;
  // 1024-byte alignment for the 128-byte swizzle atoms, then the 2 x STAGES mbarriers.
  static constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + 2 * STAGES * 8;
};
// 128 x 128 tiles, 4 stages of 48 KB (BN = 192 was as fast, but its two accumulator sets would
// not fit the consumers' 232 registers).
using Tile128 = Tile<128, 4, 1>;
using Tile128P2 = Tile<128, 4, 2>;

// ---------------------------------------------------------------------------------------------
// Device helpers (sm_90a)
// ---------------------------------------------------------------------------------------------

#if defined(HOPPER_WGMMA)

// Named barriers 1 and 2 order the consumer warpgroups' wgmma issue (0 is __syncthreads).
constexpr int kTurnThreads = 128 * kConsumers;

#endif  // HOPPER_WGMMA

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

// W (n4 float4s) -> W_hi | W_lo: hi rounded to nearest tf32 (cvt.rna: inf and NaN kept), lo = w - hi.
__global__ void split_weight_kernel(const float4* __restrict__ w, float4* __restrict__ hi, float4* __restrict__ lo,
                                    int64_t n4) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = w[i];
    float4 h, l;
    float* hv = &h.x;
    float* lv = &l.x;
    const float* vv = &v.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      uint32_t bits;
      asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(vv[e]));
      hv[e] = __uint_as_float(bits);
      lv[e] = vv[e] - hv[e];
    }
    hi[i] = h;
    lo[i] = l;
  }
}

template <class Tr>
__global__ void __launch_bounds__(kThreads, 1)
    linear_3xtf32_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                         const float* __restrict__ bias, float* __restrict__ y, int M, int N, int K,
                         int tiles_n, int tiles) {
#if defined(HOPPER_WGMMA)
  constexpr int BN = Tr::BN, STAGES = Tr::STAGES;
  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
  unsigned char* smem = align_smem_1024(smem_raw);
  const uint32_t ring = smem_u32(smem);
  const uint32_t bars = ring + STAGES * Tr::STAGE_BYTES;  // full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s)
  auto a_tile = [&](int s) { return ring + s * Tr::STAGE_BYTES; };
  auto whi_tile = [&](int s) { return ring + s * Tr::STAGE_BYTES + Tr::A_BYTES; };
  auto wlo_tile = [&](int s) { return ring + s * Tr::STAGE_BYTES + Tr::A_BYTES + Tr::B_BYTES; };
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (STAGES + s); };

  // Output tiles blockIdx.x, + gridDim.x, ...: a persistent grid of one block per SM whose
  // producer runs ahead into the next tile while the consumers store the last one (configs 0
  // and 1), or one tile per block (configs 2 and 3). Consecutive tiles share an x row block (n fastest), read once from HBM.
  const int warpgroup = threadIdx.x / 128;
  const int k_steps = (K + kBK - 1) / kBK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), kConsumers * 4);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // Producer: one thread keeps the ring full. W_hi rows are 0..N-1 of map_w, W_lo rows N..2N-1.
    // Its warpgroup gives registers back to the consumers (40 + 2 x 232 per 3 x 128 threads).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 0) {
      prefetch_tensormap(&map_x);
      prefetch_tensormap(&map_w);
      int it = 0;  // k-steps loaded so far, over all of this block's tiles: the ring position
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int n0 = (tile % tiles_n) * BN, m0 = (tile / tiles_n) * kBM;
        for (int ks = 0; ks < k_steps; ++ks, ++it) {
          const int s = it % STAGES;
          if (it >= STAGES) mbar_wait(empty(s), ((it / STAGES) - 1) & 1);
          mbar_expect_tx(full(s), Tr::STAGE_BYTES);
          tma_load_2d(a_tile(s), &map_x, ks * kBK, m0, full(s));
          tma_load_2d(whi_tile(s), &map_w, ks * kBK, n0, full(s));
          tma_load_2d(wlo_tile(s), &map_w, ks * kBK, N + n0, full(s));
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");

  // Consumers: warpgroup c owns rows 64c .. +63 of each tile; warp w of it rows +16w .. +15.
  const int c = warpgroup - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int row = c * 64 + warp * 16 + g;  // this thread's first row in the tile (and row + 8)
  // Two-level accumulation: the tensor cores sum PROMOTE k-steps (12 wgmmas and K = 32 each) into
  // `part`, and `acc` adds those partial sums in fp32 with round-to-nearest. Summing all of K on
  // the tensor cores, whose fp32 accumulation does not round to nearest, gave 11x the fp32 GEMM's
  // error at K = 768 and 80x at K = 4100; see
  // benchmarks/results/2026-12-01-wgmma-gemm-and-attention.md.
  float acc[BN / 2], part[BN / 2];

  // Turns: warpgroup 0 issues step ks once warpgroup 1 has issued step ks - 1, and
  // warpgroup 1 once warpgroup 0 has issued step ks (named barrier 2: 1 -> 0, barrier 1: 0 -> 1).
  // Warpgroup 1 opens barrier 2 once before the loop and warpgroup 0 takes the last opening after
  // it, so every barrier is used in full; the loop itself has no branch on the warpgroup (a
  // divergent path around wgmma makes ptxas serialise them). Taking turns overlaps one warpgroup's
  // fp32 adds and A loads with the other's tensor-core work (in lockstep both wait on the tensor
  // cores at once, then both leave them idle: 10% slower,
  // benchmarks/results/2026-12-01-wgmma-gemm-and-attention.md).
  const int my_turn = c == 0 ? 2 : 1, their_turn = c == 0 ? 1 : 2;
  if (c == 1) named_arrive(2, kTurnThreads);
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int n0 = (tile % tiles_n) * BN, m0 = (tile / tiles_n) * kBM;
    // The fp32 accumulator starts from the bias, loaded as the tile starts (its latency hidden
    // behind the first k-steps), so the epilogue is stores only: with the bias loaded and added
    // after the tile's last wgmmas (L2 latency on the tensor cores' critical path) c_attn took
    // 479 us instead of 449 (benchmarks/results/2026-12-01-warp-specialised-attention.md).
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = n0 + 8 * j + 2 * t;  // N is a multiple of 4 and col is even: col + 1 < N too
      const float2 b = col < N ? *reinterpret_cast<const float2*>(bias + col) : make_float2(0.f, 0.f);
      acc[4 * j] = acc[4 * j + 2] = b.x;
      acc[4 * j + 1] = acc[4 * j + 3] = b.y;
    }
    for (int ks = 0; ks < k_steps; ++ks, ++it) {
      const int s = it % STAGES;
      mbar_wait(full(s), (it / STAGES) & 1);
      // A fragments of the 4 k8 slices from the swizzled x tile: element (r, k) lives at
      // r*128 + ((k/4) ^ (r%8))*16 + (k%4)*4 bytes; here r%8 = g for both rows.
      const float* a = reinterpret_cast<const float*>(smem + s * Tr::STAGE_BYTES);
      uint32_t a_hi[4][4], a_lo[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int c0 = ((2 * kk) ^ g) * 4 + t, c1 = ((2 * kk + 1) ^ g) * 4 + t;
        split_tf32(a[row * kBK + c0], a_hi[kk][0], a_lo[kk][0]);
        split_tf32(a[(row + 8) * kBK + c0], a_hi[kk][1], a_lo[kk][1]);
        split_tf32(a[row * kBK + c1], a_hi[kk][2], a_lo[kk][2]);
        split_tf32(a[(row + 8) * kBK + c1], a_hi[kk][3], a_lo[kk][3]);
      }
      named_sync(my_turn, kTurnThreads);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_3xtf32<BN>(part, a_hi[kk], a_lo[kk], sw128_desc(whi_tile(s) + kk * 32),
                         sw128_desc(wlo_tile(s) + kk * 32), kk > 0 || ks % Tr::PROMOTE != 0);
      }
      wgmma_commit();
      named_arrive(their_turn, kTurnThreads);
      wgmma_wait_all();
      __syncwarp();
      if (lane == 0) mbar_arrive(empty(s));
      if ((ks + 1) % Tr::PROMOTE == 0 || ks + 1 == k_steps) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] += part[i];
      }
    }

    // Epilogue: float2 stores straight from the accumulator fragments.
    const int r0 = m0 + row, r1 = r0 + 8;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = n0 + 8 * j + 2 * t;
      if (col >= N) continue;  // N is a multiple of 4 and col is even: col + 1 < N as well
      if (r0 < M)
        *reinterpret_cast<float2*>(y + static_cast<int64_t>(r0) * N + col) = make_float2(acc[4 * j], acc[4 * j + 1]);
      if (r1 < M)
        *reinterpret_cast<float2*>(y + static_cast<int64_t>(r1) * N + col) =
            make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  if (c == 0) named_sync(2, kTurnThreads);
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

// A row-major (rows, K) float32 matrix read in boxes of `box_rows` x 32 floats, 128-byte swizzle,
// zero fill outside the matrix.
bool make_map(CUtensorMap* map, const float* base, int64_t rows, int64_t K, int box_rows) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K) * sizeof(float)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t step[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(base), dims, strides, box, step,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class Tr>
cudaError_t launch(const float* x, const float* w_split, const float* bias, float* y, int64_t M, int64_t N,
                   int64_t K, bool persistent, int device, cudaStream_t stream) {
  const cudaError_t raised = allow_dynamic_smem_once<linear_3xtf32_kernel<Tr>>(device, Tr::SMEM_BYTES);
  if (raised != cudaSuccess) return raised;
  CUtensorMap map_x, map_w;
  if (!make_map(&map_x, x, M, K, kBM) || !make_map(&map_w, w_split, 2 * N, K, Tr::BN)) {
    return cudaErrorNotSupported;
  }
  const int tiles_n = static_cast<int>((N + Tr::BN - 1) / Tr::BN);
  const int64_t tiles = tiles_n * ((M + kBM - 1) / kBM);
  int blocks = static_cast<int>(tiles);
  if (persistent) {
    int sms = 0;
    const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    blocks = static_cast<int>(tiles < sms ? tiles : sms);
  }
  linear_3xtf32_kernel<Tr><<<blocks, kThreads, Tr::SMEM_BYTES, stream>>>(
      map_x, map_w, bias, y, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), tiles_n,
      static_cast<int>(tiles));
  return cudaGetLastError();
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

extern "C" int linear_3xtf32_supported(const float* x, const float* weight, const float* bias, const float* y,
                                       int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0 || K % 4 != 0 || N % 4 != 0) return 0;
  if (M >= (int64_t{1} << 23) || N > (int64_t{1} << 30) / 2 || K > (int64_t{1} << 30)) return 0;
  if ((M / kBM + 1) * (N / 128 + 1) >= (int64_t{1} << 31)) return 0;  // the tile count is an int
  if (!aligned(x, 16) || !aligned(weight, 16) || !aligned(y, 16) || !aligned(bias, 8)) return 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  return device_has_sm90a(device, stream) && tensor_map_encoder() != nullptr ? 1 : 0;
}

extern "C" cudaError_t linear_3xtf32_launcher(const float* x, const float* weight, const float* bias, float* y,
                                              float* w_split, int64_t M, int64_t N, int64_t K, int config,
                                              cudaStream_t stream) {
  if (!linear_3xtf32_supported(x, weight, bias, y, M, N, K, stream) || !aligned(w_split, 16)) {
    return cudaErrorNotSupported;
  }
  if (config < 0 || config >= kLinear3xTf32Configs) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const int64_t n4 = N * K / 4;
  const int split_blocks = static_cast<int>((n4 + 255) / 256 < 1024 ? (n4 + 255) / 256 : 1024);
  split_weight_kernel<<<split_blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(weight),
                                                         reinterpret_cast<float4*>(w_split),
                                                         reinterpret_cast<float4*>(w_split + N * K), n4);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  // config 0: a persistent block per SM looping over the tiles, two k-steps per fp32 add (the
  // fastest); 1: persistent, one k-step per add (the most accurate); 2: one block per tile, one
  // k-step per add; 3: one block per tile, two k-steps per add. Measured in
  // benchmarks/results/2026-12-01-wgmma-gemm-and-attention.md.
  switch (config) {
    case 0: return launch<Tile128P2>(x, w_split, bias, y, M, N, K, true, device, stream);
    case 1: return launch<Tile128>(x, w_split, bias, y, M, N, K, true, device, stream);
    case 2: return launch<Tile128>(x, w_split, bias, y, M, N, K, false, device, stream);
    default: return launch<Tile128P2>(x, w_split, bias, y, M, N, K, false, device, stream);
  }
}
