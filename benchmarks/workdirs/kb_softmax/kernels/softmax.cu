// softmax.cu: y[r, :] = softmax(x[r, :]) for a contiguous float32 (rows, cols) input.
//
// Napkin math (KernelBench level1/23: 4096 x 393216 floats, a 6 GiB input, 1.5 MiB per row):
//   the least traffic is one read of x and one write of y: 2 x 6.44 GB = 12.9 GB, a floor of
//   3.0 ms at the H200's ~4.3 TB/s. A kernel that reads each row twice (online max/sum, then
//   the write; what Inductor's kernel does) moves 19.3 GB: 4.75 ms measured (~4.05 TB/s).
//   A row does not fit in one SM's shared memory (227 KB) but fits in 8: 8 x 192 KB.
//
// Cluster path (cols % 4 == 0, 16-byte aligned x and y, cols >= kClusterMinCols, and a row's
// 1/8 slice fits in the opt-in shared memory): a persistent grid of 8-block thread-block
// clusters, one block per SM (192 KB of dynamic shared memory for this shape), each cluster
// striding over rows. Block `rank` of a cluster owns float4 slice [rank*chunk, (rank+1)*chunk)
// of the row. Per row:
//   A. every thread, for each float4 it owns (thread t owns t, t+1024, ...; 12 here): reads the
//      previous row's value from shared memory, writes exp(x - M) / S of it to y with a
//      streaming 16-byte store, then refills that shared slot with this row's x through
//      cp.async (16 bytes, L2 only). So the previous row's write and this row's read are in
//      flight together (192 KB of loads per SM, no register staging), and x is read once.
//   B. after cp.async.wait_group, the thread folds its own values into (max, sum exp(x - max))
//      (fp32, expf), the warps and the block merge theirs (shuffles), and lanes 0..7 of warp 0
//      store the block's pair into slot [rank] of every block of the cluster (distributed
//      shared memory, double-buffered by row parity); one cluster barrier, then every thread
//      merges the 8 pairs in the same order (the same M and S cluster-wide).
//   Each thread reads back only the shared slots it filled itself, so the data buffer needs no
//   block barrier; one __syncthreads and one cluster.sync per row.
// Prediction: 12.9 GB at ~3.9-4.1 TB/s (read and write mixed, like today's kernels) plus the
// per-row barrier bubbles, which other clusters' traffic mostly covers: ~3.2-3.4 ms, about
// 1.4x torch.compile's 4.75 ms.
//
// Fallback (every other shape: tiny or odd rows, misaligned pointers, rows too long for 8
// slices, no cluster support): one block per row, an online (max, sum) pass then the write
// pass: 12 bytes per element.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <mutex>

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;

struct MaxSum {
  float m;  // running maximum
  float s;  // sum of exp(x - m)
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};  // both empty (or all -inf)
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum add(MaxSum a, float x) {
  if (x == -INFINITY) return a;  // exp(-inf) adds nothing (and -inf - -inf would be NaN)
  if (x <= a.m) return {a.m, a.s + expf(x - a.m)};
  return {x, a.s * expf(a.m - x) + 1.f};
}

__device__ __forceinline__ MaxSum warp_reduce(MaxSum v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffff, v.m, offset), __shfl_xor_sync(0xffffffff, v.s, offset)};
    v = merge(v, other);
  }
  return v;
}

__device__ MaxSum block_reduce(MaxSum v) {
  __shared__ MaxSum warp_partial[kThreads / 32];
  __shared__ MaxSum total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v);
  if (lane == 0) warp_partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    v = lane < warps ? warp_partial[lane] : MaxSum{-INFINITY, 0.f};
    v = warp_reduce(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// ------------------------------------------------------------------ fallback: one block per row
// vec4: the row is read and written as float4 (cols % 4 == 0 and 16-byte aligned rows).
template <bool vec4>
__global__ void __launch_bounds__(kThreads) softmax_kernel(const float* __restrict__ x, float* __restrict__ y,
                                                           int64_t cols) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float* yr = y + row * cols;
  MaxSum acc{-INFINITY, 0.f};
  if (vec4) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const int64_t n4 = cols / 4;
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = x4[i];
      acc = add(add(add(add(acc, v.x), v.y), v.z), v.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) acc = add(acc, xr[i]);
  }
  const MaxSum row_total = block_reduce(acc);
  const float m = row_total.m, inv = 1.f / row_total.s;
  if (vec4) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    float4* y4 = reinterpret_cast<float4*>(yr);
    const int64_t n4 = cols / 4;
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      const float4 v = x4[i];
      y4[i] = make_float4(expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv, expf(v.w - m) * inv);
    }
  } else {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = expf(xr[i] - m) * inv;
  }
}

// ------------------------------------------------------------ cluster path: one read per element
constexpr int kClusterSize = 8;                 // blocks per row (portable cluster size)
constexpr int kClusterThreads = 1024;           // threads per block; one block per SM
constexpr int kGroup = 4;                       // float4s a thread handles per step
constexpr int64_t kClusterMinCols = 65536;      // below this the one-block-per-row kernel is fine

__device__ __forceinline__ void cp_async16(float4* smem_dst, const float4* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const size_t src = __cvta_generic_to_global(gmem_src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ float4 normalize(float4 v, float m, float inv) {
  return make_float4(expf(v.x - m) * inv, expf(v.y - m) * inv, expf(v.z - m) * inv, expf(v.w - m) * inv);
}
__device__ __forceinline__ float max4(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }

// Steps k in [k0, k1) of this thread's slots (slot index tid + k * kClusterThreads): when
// kWrite, write the previous row's normalized value held in the slot to `dst`; then start the
// copy of this row's x into the slot.
template <bool kWrite>
__device__ __forceinline__ void refill(float4* slice, const float4* __restrict__ src, float4* __restrict__ dst,
                                       int k0, int k1, float m, float inv) {
  const int tid = threadIdx.x;
  for (int k = k0; k < k1; k += kGroup) {
    if (kWrite) {
      float4 old[kGroup];
#pragma unroll
      for (int u = 0; u < kGroup; ++u)
        if (k + u < k1) old[u] = slice[tid + (k + u) * kClusterThreads];
#pragma unroll
      for (int u = 0; u < kGroup; ++u)
        if (k + u < k1) __stcs(dst + tid + (k + u) * kClusterThreads, normalize(old[u], m, inv));
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (k + u < k1) {
        const int i = tid + (k + u) * kClusterThreads;
        cp_async16(slice + i, src + i);
      }
    }
  }
}

// Folds this thread's slots k in [k0, k1) into acc, kGroup float4s (16 values) at a time:
// one rescale per group, branch-free within it.
__device__ __forceinline__ MaxSum accumulate(const float4* slice, int k0, int k1, MaxSum acc) {
  const int tid = threadIdx.x;
  for (int k = k0; k < k1; k += kGroup) {
    float4 v[kGroup];
    float g = -INFINITY;
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (k + u < k1) {
        v[u] = slice[tid + (k + u) * kClusterThreads];
        g = fmaxf(g, max4(v[u]));
      }
    }
    const float m = fmaxf(acc.m, g);
    if (m != -INFINITY) {  // else every value so far is -inf: nothing to add
      float s = acc.s * expf(acc.m - m);
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        if (k + u < k1) s += (expf(v[u].x - m) + expf(v[u].y - m)) + (expf(v[u].z - m) + expf(v[u].w - m));
      }
      acc = {m, s};
    }
  }
  return acc;
}

// Grid: (clusters * kClusterSize) blocks of kClusterThreads, cluster dims (kClusterSize, 1, 1),
// dynamic shared memory chunk * 16 bytes. n4 = cols / 4; chunk = ceil(n4 / kClusterSize).
__global__ void __launch_bounds__(kClusterThreads, 1)
    softmax_cluster_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t rows, int64_t n4,
                           int chunk) {
  extern __shared__ float4 slice[];
  __shared__ MaxSum warp_partial[kClusterThreads / 32];
  __shared__ MaxSum cluster_partial[2][kClusterSize];  // [row parity][block rank]

  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int64_t cluster_id = blockIdx.x / kClusterSize;
  const int64_t clusters = gridDim.x / kClusterSize;
  const int64_t begin = static_cast<int64_t>(rank) * chunk;
  const int64_t left = n4 - begin;
  const int len = left <= 0 ? 0 : (left < chunk ? static_cast<int>(left) : chunk);  // float4s owned
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int steps = tid < len ? (len - 1 - tid) / kClusterThreads + 1 : 0;  // slots of this thread
  // Two cp.async groups: fold the first while the second lands. The split is a whole number of
  // kGroup steps (12 steps here: 8 + 4).
  const int half_up = ((steps + 1) / 2 + kGroup - 1) / kGroup * kGroup;
  const int half = half_up < steps ? half_up : steps;

  cluster.sync();  // every block of the cluster has started before any distributed-shared store

  int64_t prev = -1;  // the row whose x the slots hold (not yet written)
  float m_prev = 0.f, inv_prev = 0.f;
  int parity = 0;
  for (int64_t row = cluster_id; row < rows; row += clusters) {
    const float4* src = x + row * n4 + begin;
    if (prev >= 0) {
      float4* dst = y + prev * n4 + begin;
      refill<true>(slice, src, dst, 0, half, m_prev, inv_prev);
      cp_async_commit();
      refill<true>(slice, src, dst, half, steps, m_prev, inv_prev);
      cp_async_commit();
    } else {
      refill<false>(slice, src, nullptr, 0, half, 0.f, 0.f);
      cp_async_commit();
      refill<false>(slice, src, nullptr, half, steps, 0.f, 0.f);
      cp_async_commit();
    }
    MaxSum acc{-INFINITY, 0.f};
    cp_async_wait<1>();
    acc = accumulate(slice, 0, half, acc);
    cp_async_wait<0>();
    acc = accumulate(slice, half, steps, acc);

    acc = warp_reduce(acc);
    if (lane == 0) warp_partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = warp_reduce(warp_partial[lane]);  // kClusterThreads / 32 == 32 warps
      acc.m = __shfl_sync(0xffffffff, acc.m, 0);  // lane 0's pair, the same to every peer
      acc.s = __shfl_sync(0xffffffff, acc.s, 0);
      if (lane < kClusterSize) *cluster.map_shared_rank(&cluster_partial[parity][rank], lane) = acc;
    }
    // Release/acquire: the pairs are visible to the whole cluster after it. Also orders this
    // row's reads of warp_partial before the next row's writes, and (with the parity) a peer's
    // reads of cluster_partial[parity] before anyone's next write to it, two rows later.
    cluster.sync();
    MaxSum total{-INFINITY, 0.f};
#pragma unroll
    for (int r = 0; r < kClusterSize; ++r) total = merge(total, cluster_partial[parity][r]);
    m_prev = total.m;
    inv_prev = 1.f / total.s;
    prev = row;
    parity ^= 1;
  }
  if (prev >= 0) {  // the last row still sits in shared memory
    float4* dst = y + prev * n4 + begin;
    for (int k = 0; k < steps; ++k) {
      const int i = tid + k * kClusterThreads;
      __stcs(dst + i, normalize(slice[i], m_prev, inv_prev));
    }
  }
  // No distributed-shared access after the last cluster.sync: blocks may exit independently.
}

namespace {

constexpr int kMaxDevices = 64;

struct ClusterInfo {
  bool probed = false;
  bool usable = false;      // cluster launch supported and the shared-memory opt-in set
  int max_dynamic = 0;      // dynamic shared memory bytes a block may use
  size_t plan_bytes = 0;    // cached: dynamic shared memory of the last plan
  int plan_clusters = 0;    //         and how many clusters fit with it
};

std::mutex g_cluster_mutex;
ClusterInfo g_cluster_info[kMaxDevices];

cudaLaunchConfig_t cluster_config(cudaLaunchAttribute* attr, unsigned clusters, size_t smem, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(clusters * kClusterSize, 1, 1);
  config.blockDim = dim3(kClusterThreads, 1, 1);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterSize;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

// How many clusters to launch for slices of `smem` bytes on the current device; 0: use the
// fallback. Any runtime error here is cleared (the fallback then runs).
int cluster_count(size_t smem) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return 0;
  }
  std::lock_guard<std::mutex> lock(g_cluster_mutex);
  ClusterInfo& info = g_cluster_info[device];
  if (!info.probed) {
    info.probed = true;
    int cluster_launch = 0, optin = 0;
    cudaFuncAttributes attrs = {};
    if (cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
        cudaFuncGetAttributes(&attrs, softmax_cluster_kernel) == cudaSuccess && cluster_launch != 0 &&
        optin > static_cast<int>(attrs.sharedSizeBytes)) {
      const int max_dynamic = optin - static_cast<int>(attrs.sharedSizeBytes);
      if (cudaFuncSetAttribute(softmax_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dynamic) ==
          cudaSuccess) {
        info.usable = true;
        info.max_dynamic = max_dynamic;
      }
    }
    cudaGetLastError();
  }
  if (!info.usable || smem > static_cast<size_t>(info.max_dynamic)) return 0;
  if (info.plan_bytes != smem) {
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t config = cluster_config(attr, 1, smem, nullptr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, softmax_cluster_kernel, &config) != cudaSuccess) clusters = 0;
    cudaGetLastError();
    info.plan_bytes = smem;
    info.plan_clusters = clusters > 0 ? clusters : 0;
  }
  return info.plan_clusters;
}

}  // namespace

extern "C" cudaError_t softmax_launcher(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const bool vec4 = cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (vec4 && cols >= kClusterMinCols) {
    const int64_t n4 = cols / 4;
    const int64_t chunk = (n4 + kClusterSize - 1) / kClusterSize;
    const size_t smem = static_cast<size_t>(chunk) * sizeof(float4);
    if (chunk <= 0x7fffffffLL) {
      const int fit = cluster_count(smem);
      if (fit > 0) {
        const unsigned clusters = static_cast<unsigned>(rows < fit ? rows : fit);
        cudaLaunchAttribute attr[1];
        cudaLaunchConfig_t config = cluster_config(attr, clusters, smem, stream);
        const cudaError_t status =
            cudaLaunchKernelEx(&config, softmax_cluster_kernel, reinterpret_cast<const float4*>(x),
                               reinterpret_cast<float4*>(y), rows, n4, static_cast<int>(chunk));
        if (status == cudaSuccess) return cudaGetLastError();
        cudaGetLastError();  // the launch was refused: clear it and take the fallback
      }
    }
  }
  if (rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  const int threads = cols >= kThreads ? kThreads : ((static_cast<int>(cols) + 31) / 32) * 32;
  if (vec4) {
    softmax_kernel<true><<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, y, cols);
  } else {
    softmax_kernel<false><<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, y, cols);
  }
  return cudaGetLastError();
}
