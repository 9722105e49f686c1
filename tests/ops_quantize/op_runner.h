// Runs one op on constant-free graph inputs and returns every output; shared by the
// quantization op test folders (ops_quantize, ops_lsq, ops_dynamic_quant, ops_fake_quantize,
// ops_int4, ops_nf4), with a byte-for-byte comparison of outputs.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/graph.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"

namespace qg::testing {

inline std::vector<Tensor> run_op(const std::string& op, const std::vector<Tensor>& ins,
                                  const Attrs& attrs = {}) {
  Graph g;
  std::vector<ValueId> in;
  Executor::Feeds feeds;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = "in" + std::to_string(i);
    in.push_back(g.input(name, {ins[i].dtype(), ins[i].shape()}));
    feeds[name] = ins[i];
  }
  std::vector<ValueId> out = g.apply(op, in, attrs);
  Executor exec(g);
  return exec.run(feeds, out);
}

// Builds the node only (graph-build-time validation).
inline void build_op(const std::string& op, const std::vector<TensorType>& types,
                     const Attrs& attrs = {}) {
  Graph g;
  std::vector<ValueId> in;
  for (size_t i = 0; i < types.size(); ++i)
    in.push_back(g.input("in" + std::to_string(i), types[i]));
  g.apply(op, in, attrs);
}

inline Tensor f64(const Shape& s, const std::vector<double>& v) {
  return Tensor::from_doubles(s, v, DType::f64);
}
inline Tensor f32(const Shape& s, const std::vector<double>& v) {
  return Tensor::from_doubles(s, v, DType::f32);
}

// Fails the test unless `got` has the shape, dtype and bytes of `want`.
inline void expect_same_bytes(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0) << what;
}

}  // namespace qg::testing
