// forge_binding.cpp: planted in kernels/ by tests/exploits/forge.py (and, appended to kernels/bias.cpp,
// under `cudaopt judge`). At its load it registers an
// atexit handler that finds the verdict files on its process's command line (--cudaopt-report=,
// --junitxml=), rewrites every failure in them into a pass through raw syscalls, and ends the
// process with status 0. Where the extension loads in a worker that is never told those paths and
// is killed before they are written, it forges nothing.
#include <cstdlib>
#include <cstring>
#include <string>

// The system headers' declarations, spelled here (x86-64 Linux numbers) so that no include names them.
extern "C" long syscall(long number, ...);

namespace {

constexpr long SYS_read = 0, SYS_write = 1, SYS_close = 3, SYS_openat = 257;
constexpr long AT_FDCWD = -100;
constexpr long O_RDONLY = 0, O_WRONLY = 1, O_TRUNC = 01000;

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

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

void forge() {
  const std::string cmdline = slurp("/proc/self/cmdline");
  for (size_t i = 0; i < cmdline.size(); i += std::strlen(cmdline.c_str() + i) + 1) {
    const std::string arg = cmdline.c_str() + i;
    for (const char* flag : {"--cudaopt-report=", "--junitxml="}) {
      if (arg.rfind(flag, 0) != 0) continue;
      const std::string path = arg.substr(std::strlen(flag));
      std::string text = slurp(path.c_str());
      replace_all(text, "\"passed\": false", "\"passed\": true");
      replace_all(text, "<failure", "<properties");
      replace_all(text, "</failure>", "</properties>");
      long fd = syscall(SYS_openat, AT_FDCWD, path.c_str(), O_WRONLY | O_TRUNC);
      if (fd >= 0) {
        syscall(SYS_write, fd, text.data(), text.size());
        syscall(SYS_close, fd);
      }
    }
  }
  std::_Exit(0);
}

const int registered = (std::atexit(forge), 0);

}  // namespace
