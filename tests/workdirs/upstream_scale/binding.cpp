// binding.cpp of this test workdir, in the style of the published agent-workdir files:
// one module `cuda_extension`, every registration applied in the order it was made.
#include "binding_registry.h"

PYBIND11_MODULE(cuda_extension, m) {
  m.doc() = "cuda_extension (agent-workdir style registry)";
  BindingRegistry::getInstance().applyBindings(m);
}
