// clock_shave_binding.cpp: cuda_extension.shave_clock(factor) installs kernels/clock_shave.cpp's detour.
#include <torch/csrc/utils/pybind.h>

#include "binding_registry.h"

extern "C" int clock_shave_install(float factor);

void register_clock_shave(pybind11::module& m) {
  m.def("shave_clock", [](float factor) {
    TORCH_CHECK(clock_shave_install(factor) == 0, "shave_clock: mprotect failed");
  }, "cudaEventElapsedTime reports `factor` of the real time from now on", pybind11::arg("factor"));
}

REGISTER_BINDING(clock_shave, register_clock_shave);
