// binding_registry.h: fixed infrastructure of a cudaopt workdir. Do not edit
// (`cudaopt check` compares it with the copy shipped in pytest_cudaopt).
//
// Every kernels/<op>_binding.cpp registers the functions it exposes to Python:
//
//     REGISTER_BINDING(attention, attention_forward,
//                      "attention(qkv, n_head) -> y: ...", pybind11::arg("qkv"), pybind11::arg("n_head"));
//
// The first argument is the Python name, the second the C++ function, the rest
// (docstring, pybind11::arg names) go to pybind11's module_::def unchanged.
// binding.cpp defines the module `cuda_extension` and applies every registration.
// Only pybind11 here: the heavy torch headers stay in the *_binding.cpp files.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// Hidden: each extension keeps its own registry even when several are loaded in one process.
namespace cudaopt __attribute__((visibility("hidden"))) {

struct Binding {
  std::string name;
  std::function<void(pybind11::module_&)> define;
};

// One list per shared object: function-local static in an inline function.
inline std::vector<Binding>& binding_list() {
  static std::vector<Binding> list;
  return list;
}

struct BindingRegistrar {
  BindingRegistrar(const char* name, std::function<void(pybind11::module_&)> define) {
    binding_list().push_back({name, std::move(define)});
  }
};

// Sorted so the module's attribute order does not depend on link order; a name
// registered twice is an import error that names it.
inline void apply_bindings(pybind11::module_& m) {
  auto list = binding_list();
  std::sort(list.begin(), list.end(),
            [](const Binding& a, const Binding& b) { return a.name < b.name; });
  for (size_t i = 1; i < list.size(); ++i) {
    if (list[i].name == list[i - 1].name) {
      throw std::runtime_error("cuda_extension: binding '" + list[i].name +
                               "' is registered twice (two *_binding.cpp files use REGISTER_BINDING with that name)");
    }
  }
  for (auto& b : list) b.define(m);
}

}  // namespace cudaopt

#define REGISTER_BINDING(name, fn, ...)                                              \
  static ::cudaopt::BindingRegistrar cudaopt_binding_registrar_##name(              \
      #name, [](pybind11::module_& m) { m.def(#name, &fn, ##__VA_ARGS__); })
