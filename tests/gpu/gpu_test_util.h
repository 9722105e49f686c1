// Helpers for the GPU tests: skip with a printed reason where no device is present, run a
// one-op graph on a chosen device, and call a registered kernel directly (to hand it
// tensors the executor would never produce, such as host tensors).
#pragma once

#include <gtest/gtest.h>

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

// Bitwise equality of two host tensors of the same dtype and shape.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace qg::testing
