// Helpers for the GPU tests: skip with a printed reason where no device is present, run a
// one-op graph on a chosen device, and call a registered kernel directly (to hand it
// tensors the executor would never produce, such as host tensors).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/graph.h"
#include "runtime/backend.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"

#define QG_REQUIRE_GPU()                                                                  \
  do {                                                                                    \
    if (!::qg::cuda_available())                                                          \
      GTEST_SKIP() << "no CUDA device present (or built without CUDA): GPU test skipped"; \
  } while (0)

namespace qg::testing {

// Runs `op` on inputs named in0.. and returns every output (on the host). `options` set up
// the executor's DeviceContext (precision flags, stream).
inline std::vector<Tensor> run_op(Device device, const std::string& op,
                                  const std::vector<Tensor>& inputs, const Attrs& attrs = {},
                                  int steps = 1, const ContextOptions& options = {}) {
  Graph g;
  std::vector<ValueId> ins;
  Executor::Feeds feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = "in" + std::to_string(i);
    ins.push_back(g.input(name, {inputs[i].dtype(), inputs[i].shape()}));
    feeds[name] = inputs[i];
  }
  std::vector<ValueId> outs = g.apply(op, ins, attrs, op);
  Executor exec(g, device, options);
  std::vector<Tensor> got;
  for (int s = 0; s < steps; ++s) got = exec.run(feeds, outs);
  for (Tensor& t : got) t = t.to(Device::cpu());
  return got;
}

// A tensor of uniform values in [-1, 1) from a seeded generator.
inline Tensor random_f32(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& e : v) e = u(rng);
  return Tensor::from_doubles(s, v, DType::f32);
}

// max |got - want| / max |want|.
inline double relative_error(const Tensor& got, const Tensor& want) {
  auto g = got.to_doubles(), w = want.to_doubles();
  double scale = 1e-30, worst = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
  return worst / scale;
}

// Device-context options with TF32 GEMMs and convolutions on or off.
inline ContextOptions tf32(bool on) {
  ContextOptions o;
  o.precision.allow_tf32 = on;
  return o;
}

// Bitwise equality of two host tensors of the same dtype and shape.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace qg::testing
