// binding_registry.h of this test workdir: a registry in the style of the published
// agent-workdir infrastructure (written for the tests, not a copy of it): a singleton that
// keeps `void(pybind11::module&)` registration functions and applies them in registration
// order. `cudaopt` must build and load a workdir that carries such files unchanged.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

class BindingRegistry {
 public:
  using RegisterFn = std::function<void(pybind11::module&)>;

  static BindingRegistry& getInstance() {
    static BindingRegistry instance;
    return instance;
  }

  void registerBinding(const std::string& name, RegisterFn fn) { entries_.emplace_back(name, std::move(fn)); }

  void applyBindings(pybind11::module& m) {
    for (auto& entry : entries_) entry.second(m);
  }

 private:
  std::vector<std::pair<std::string, RegisterFn>> entries_;
};

#define REGISTER_BINDING(name, fn)                                                    \
  static bool name##_binding_registered = [] {                                        \
    BindingRegistry::getInstance().registerBinding(#name, fn);                        \
    return true;                                                                      \
  }()
