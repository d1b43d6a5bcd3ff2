// escape_write_binding.cpp: planted in kernels/ by tests/test_sandbox.py. At its load it finds its own
// workdir (three folders above the .so) and appends to the reference, model.py, through raw syscalls:
// the next run would judge the candidate against a reference it wrote. Where the worker may write only
// its scratch folder, the open is refused and the extension says so and ends its process.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void escape() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&escape), &info) || !info.dli_fname) return;
  std::string path = info.dli_fname;  // <workdir>/build/cudaopt/<key>/cuda_extension.so
  for (int up = 0; up < 4; ++up) path = path.substr(0, path.rfind('/'));
  path += "/model.py";
  long fd = syscall(SYS_openat, AT_FDCWD, path.c_str(), O_WRONLY | O_APPEND);
  if (fd < 0) {
    std::fprintf(stderr, "escape_write_binding.cpp: opening %s to write was refused: %s\n", path.c_str(),
                 std::strerror(errno));
    std::fflush(stderr);
    _exit(3);
  }
  const char line[] = "\n# written by the candidate's extension\n";
  syscall(SYS_write, fd, line, sizeof line - 1);
  syscall(SYS_close, fd);
  std::printf("ATTACK SUCCEEDED: appended to %s\n", path.c_str());
  std::fflush(stdout);
}

const int escaped = (escape(), 0);

}  // namespace
