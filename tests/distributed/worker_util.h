// What the data-parallel worker programs write for the tests to compare: tensors as hex, and
// a digest of every state of an executor.
#pragma once

#include <cstdio>
#include <string>

#include "core/tensor.h"
#include "runtime/compile.h"
#include "runtime/executor.h"

namespace qg::testing {

inline std::string hex_of(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  static const char* d = "0123456789abcdef";
  std::string s;
  const auto* p = static_cast<const unsigned char*>(h.raw_data());
  for (size_t i = 0; i < h.nbytes(); ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

// FNV-1a over the bytes of `t` (for tensors too long to write out whole).
inline std::string bytes_digest(const Tensor& t) {
  Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// FNV-1a over every state of `exec` (parameters, moments, observer statistics); with
// `optimizer` false, over all but the optimizer's (Adam's) states.
inline std::string state_digest(Executor& exec, bool optimizer = true) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& [key, t] : state_index(exec)) {
    if (!optimizer && key.find(".adam/") != std::string::npos) continue;
    for (char c : key) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    Tensor c = t->device().is_cpu() ? *t : t->to(Device::cpu());
    const auto* p = static_cast<const unsigned char*>(c.raw_data());
    for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace qg::testing
