// hopper.h: Hopper (sm_90a) device helpers shared by the kernels that use wgmma: the 3xTF32 split,
// wgmma shared-memory descriptors, the register-A tf32 wgmma and its 3xTF32 step; a probe that
// tells whether the running device's image of the extension was built for sm_90a; and the
// launchers' once-per-device opt-in to large dynamic shared memory. No torch here.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>

// Defined where this translation unit is compiled for sm_90a: the only place wgmma exists.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HOPPER_WGMMA 1
#endif

namespace hopper {

#if defined(HOPPER_WGMMA)
constexpr uint32_t kTf32KeepMask = 0xffffe000u;  // sign, exponent and the top 10 mantissa bits
constexpr uint32_t kTf32HalfUlp = 0x1000u;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first 1024-byte aligned byte of a dynamic shared-memory array (the swizzle atoms' alignment),
// derived from the array by pointer arithmetic: the compiler then still knows the pointer is
// shared and compiles accesses through it to LDS/STS with 32-bit addresses (through uintptr_t
// it loses that and emits generic 64-bit LD/ST with their address arithmetic).
__device__ __forceinline__ unsigned char* align_smem_1024(unsigned char* smem) {
  return smem + ((1024u - (smem_u32(smem) & 1023u)) & 1023u);
}

// x = hi + lo for 3xTF32: hi = x rounded to tf32 (2 integer ops; operands are finite), lo = x - hi
// exact; the tensor core reads lo's top 19 bits.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = (__float_as_uint(x) + kTf32HalfUlp) & kTf32KeepMask;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle layout: rows of 128
// bytes (32 floats), 8-row groups 1024 bytes apart (SBO); LBO is unused for this layout. Element
// (r, k) of such a tile is at r*128 + ((k/4) ^ (r%8))*16 + (k%4)*4 bytes from its 1024-aligned
// base; advancing the start address by 32 bytes selects the next k8 slice inside the row.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

// Byte offset of element (r, k), k < 32, inside a 128-byte-swizzled K-major tile.
__device__ __forceinline__ uint32_t sw128_offset(int r, int k) {
  return static_cast<uint32_t>(r * 128 + (((k >> 2) ^ (r & 7)) << 4) + ((k & 3) << 2));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Generic-proxy writes to shared memory (st.shared) made visible to wgmma's async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// mbarriers in shared memory (addresses from smem_u32): init with an arrival count, arrive
// (release), arrive announcing `bytes` of TMA transactions, and a spin on the phase parity (acquire).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// TMA: the box at coordinates (c0 = innermost, c1[, c2]) of `map` into shared memory, its bytes
// completing on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Named barriers (id 0 is __syncthreads): wait for `threads` arrivals, or arrive without waiting.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// D (64 x N, fp32, registers) = or += A (64 x 8, tf32, registers) x B (8 x N, tf32, shared memory).
// Fragments: A as mma.m16n8k8 per warp (a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4));
// D per n8 column block j: d[4j..4j+3] = (g, 8j+2t), (g, 8j+2t+1), (g+8, 8j+2t), (g+8, 8j+2t+1),
// rows relative to the warp's 16 (g = lane / 4, t = lane % 4). accumulate = 0 overwrites D.
template <int N>
__device__ __forceinline__ void wgmma_tf32_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                              int accumulate);

template <>
__device__ __forceinline__ void wgmma_tf32_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                  int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n"
      "}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_tf32_rs<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                  int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n"
      "}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
// One 3xTF32 step of D (64 x N) over a k8 slice: A = a_hi + a_lo (registers), B = b_hi + b_lo
// (descriptors), the three products with the small terms first. accumulate = 0 starts D afresh.
template <int N>
__device__ __forceinline__ void wgmma_3xtf32(float (&d)[N / 2], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                             uint64_t b_hi, uint64_t b_lo, int accumulate) {
  wgmma_tf32_rs<N>(d, a_lo, b_hi, accumulate);
  wgmma_tf32_rs<N>(d, a_hi, b_lo, 1);
  wgmma_tf32_rs<N>(d, a_hi, b_hi, 1);
}
#endif  // HOPPER_WGMMA

constexpr int kMaxDevices = 64;

// The driver's cuTensorMapEncodeTiled (through the runtime, so no -lcuda), or nullptr.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device (it is a property of
// the function in the device's context, not of a launch); the status of that one call.
template <auto Kernel>
cudaError_t allow_dynamic_smem_once(int device, int bytes) {
  static std::once_flag done[kMaxDevices];
  static cudaError_t status[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  std::call_once(done[device], [device, bytes] {
    status[device] = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
  return status[device];
}

// Whether `device` runs this translation unit's sm_90a code: a one-int kernel, run once per device
// on `stream` and synchronised (false where the image lacks sm_90a or the launch fails; not
// during stream capture, where the answer is false until a later call can probe).
// static: each translation unit has its own device image, and its own probe of it.
static __device__ int g_sm90a_probe;
static __global__ void probe_sm90a_kernel() {
#if defined(HOPPER_WGMMA)
  g_sm90a_probe = 1;
#else
  g_sm90a_probe = 2;
#endif
}

static bool device_has_sm90a(int device, cudaStream_t stream) {
  static std::mutex mutex;
  static std::atomic<int> known[kMaxDevices];  // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= kMaxDevices) return false;
  if (const int k = known[device].load(std::memory_order_acquire); k != 0) return k == 1;  // every call after the first
  std::lock_guard<std::mutex> lock(mutex);
  if (known[device] != 0) return known[device] == 1;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    return false;
  }
  cudaDeviceProp prop{};
  bool yes = false;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess && prop.major == 9 && prop.minor == 0) {
    int host = 0;
    probe_sm90a_kernel<<<1, 1, 0, stream>>>();
    if (cudaGetLastError() == cudaSuccess &&
        cudaMemcpyFromSymbolAsync(&host, g_sm90a_probe, sizeof(int), 0, cudaMemcpyDeviceToHost, stream) ==
            cudaSuccess &&
        cudaStreamSynchronize(stream) == cudaSuccess) {
      yes = host == 1;
    }
    cudaGetLastError();  // a failed probe leaves no sticky launch error behind
  }
  known[device].store(yes ? 1 : 2, std::memory_order_release);
  return yes;
}

}  // namespace hopper
