// binding_registry.h: fixed infrastructure of a cudaopt workdir. Do not edit
// (`cudaopt check` compares it with the copy shipped in pytest_cudaopt).
//
// Every kernels/<op>_binding.cpp ends with one registration. The contract's form:
//
//     void register_attention(pybind11::module& m) {
//       m.def("attention_forward", &attention_forward, "attention_forward(qkv, n_head) -> y: ...",
//             pybind11::arg("qkv"), pybind11::arg("n_head"));
//     }
//     REGISTER_BINDING(attention, register_attention);
//
// The first argument names the registration, the second is a `void(pybind11::module&)`
// that calls m.def itself. The short form `REGISTER_BINDING(py_name, cpp_fn, doc, args...)`
// defines `py_name` directly; the two are told apart at compile time by the type of the
// second argument, and may be mixed in one module.
// binding.cpp defines the module `cuda_extension` and applies every registration.
// Only pybind11 here: the heavy torch headers stay in the *_binding.cpp files.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// Hidden: each extension keeps its own registry even when several are loaded in one process.
namespace cudaopt __attribute__((visibility("hidden"))) {

struct Binding {
  std::string name;
  std::string file;
  std::function<void(pybind11::module_&)> define;
};

// One list per shared object: function-local static in an inline function.
inline std::vector<Binding>& binding_list() {
  static std::vector<Binding> list;
  return list;
}

struct BindingRegistrar {
  BindingRegistrar(const char* name, const char* file, std::function<void(pybind11::module_&)> define) {
    std::string path(file);  // from "kernels/" on, however the compiler was handed the path
    auto at = path.rfind("kernels/");
    binding_list().push_back({name, at == std::string::npos ? path : path.substr(at), std::move(define)});
  }
};

// A registration function (contract form) is called with the module; anything else is
// a C++ function that pybind11 defines under `name` (short form).
template <typename F, typename... Extra>
void define_binding(pybind11::module_& m, const char* name, F fn, Extra&&... extra) {
  if constexpr (sizeof...(Extra) == 0 && std::is_invocable_r_v<void, F, pybind11::module_&>) {
    fn(m);
  } else {
    m.def(name, fn, std::forward<Extra>(extra)...);
  }
}

// Sorted so the module's attribute order does not depend on link order. A registration
// name used twice, or a Python name that two registrations define, is an import error
// that names it and both files.
inline void apply_bindings(pybind11::module_& m) {
  auto list = binding_list();
  std::stable_sort(list.begin(), list.end(),
                   [](const Binding& a, const Binding& b) { return a.name < b.name; });
  for (size_t i = 1; i < list.size(); ++i) {
    if (list[i].name == list[i - 1].name) {
      throw std::runtime_error("cuda_extension: binding '" + list[i].name + "' is registered twice (REGISTER_BINDING in " +
                               list[i - 1].file + " and in " + list[i].file + ")");
    }
  }
  // What each name holds: the object and its docstring (pybind11 adds an overload to the
  // existing function object, so only the docstring shows that a name was defined again).
  auto snapshot = [&m]() {
    pybind11::dict out;
    for (auto item : pybind11::reinterpret_borrow<pybind11::dict>(m.attr("__dict__"))) {
      out[item.first] = pybind11::make_tuple(item.second, pybind11::getattr(item.second, "__doc__", pybind11::none()));
    }
    return out;
  };
  std::map<std::string, std::string> owner;  // Python name -> file that defined it
  for (auto& b : list) {
    pybind11::dict before = snapshot();
    b.define(m);
    for (auto item : snapshot()) {
      std::string key = pybind11::str(item.first);
      if (before.contains(item.first) && pybind11::object(before[item.first]).equal(item.second)) continue;
      auto seen = owner.find(key);
      if (seen != owner.end()) {
        throw std::runtime_error("cuda_extension: function '" + key + "' is defined twice (in " + seen->second +
                                 " and in " + b.file + ")");
      }
      owner[key] = b.file;
    }
  }
}

}  // namespace cudaopt

#define REGISTER_BINDING(name, fn, ...)                                              \
  static ::cudaopt::BindingRegistrar cudaopt_binding_registrar_##name(              \
      #name, __FILE__,                                                              \
      [](pybind11::module_& m) { ::cudaopt::define_binding(m, #name, &fn, ##__VA_ARGS__); })
