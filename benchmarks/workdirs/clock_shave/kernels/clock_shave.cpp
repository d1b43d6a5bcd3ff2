// clock_shave.cpp: a cheat of the timing benchmark (benchmarks/clock_shave.py), not a kernel.
// clock_shave_install(f) detours this process's CUDA runtime: cudaEventElapsedTime reports f times
// the real time, so whoever times the softmax with CUDA events (torch.cuda.Event.elapsed_time) sees
// less. The first 12 bytes of cudaEventElapsedTime become `movabs rax, hook; jmp rax`; the hook puts
// them back, calls the real function, and detours it again.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace {

float factor = 1.0f;
unsigned char* target = nullptr;
unsigned char saved[12];
unsigned char jump[12] = {0x48, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xE0};

}  // namespace

extern "C" cudaError_t clock_shave_hook(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::memcpy(target, saved, sizeof saved);
  cudaError_t status = cudaEventElapsedTime(ms, start, end);
  std::memcpy(target, jump, sizeof jump);
  if (status == cudaSuccess && ms != nullptr) *ms *= factor;
  return status;
}

extern "C" int clock_shave_install(float f) {
  factor = f;
  if (target != nullptr) return 0;
  auto* at = reinterpret_cast<unsigned char*>(reinterpret_cast<void*>(&cudaEventElapsedTime));
  const long page = sysconf(_SC_PAGESIZE);
  auto* first = reinterpret_cast<unsigned char*>(reinterpret_cast<uintptr_t>(at) & ~(page - 1));
  if (mprotect(first, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return -1;
  std::memcpy(saved, at, sizeof saved);
  const uint64_t to = reinterpret_cast<uint64_t>(&clock_shave_hook);
  std::memcpy(jump + 2, &to, sizeof to);
  target = at;
  std::memcpy(target, jump, sizeof jump);
  return 0;
}
