// The graph the fuse_ste_mul_pair pass rewrites, shared by its CPU and GPU tests:
//   dy [rows, cols] -> ste_backward(dy, mask) -> (reshape to [2, rows / 2, cols]) -> v
//   ya = mul(v, a), yb = mul(b, v)      (the second mul reads v second: both operand orders)
// and feeds with NaN (both signs), infinities, signed zeros and random mask bytes.
#pragma once

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/graph.h"
#include "nn/llama.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "tests/common/tensor_compare.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg::testing {

struct MulPairCase {
  DType dtype = DType::f32;
  int64_t rows = 6, cols = 13;  // 78 elements: 9 whole mask bytes and a partial one
  bool reshape = true;
};

inline Shape mul_pair_shape(const MulPairCase& c) {
  return c.reshape ? Shape{2, c.rows / 2, c.cols} : Shape{c.rows, c.cols};
}

// Builds the graph; returns v, the masked gradient's last view. Inputs dy, mask, a, b; outputs
// "ya" and "yb".
inline ValueId build_mul_pair(Graph& g, const MulPairCase& c) {
  const int64_t n = c.rows * c.cols;
  ValueId dy = g.input("dy", {c.dtype, {c.rows, c.cols}});
  ValueId mask = g.input("mask", {DType::u8, {(n + 7) / 8}});
  ValueId a = g.input("a", {c.dtype, mul_pair_shape(c)});
  ValueId b = g.input("b", {c.dtype, mul_pair_shape(c)});
  ValueId v = g.apply1("ste_backward", {dy, mask});
  if (c.reshape) v = g.apply1("reshape", {v}, {{"shape", mul_pair_shape(c)}});
  g.set_name(g.apply1("mul", {v, a}), "ya");
  g.set_name(g.apply1("mul", {b, v}), "yb");
  g.mark_output(g.at("ya"));
  g.mark_output(g.at("yb"));
  return v;
}

inline Tensor special_values(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    switch ((i * 7 + seed) % 23) {
      case 0:
        v[i] = nan;
        break;
      case 1:
        v[i] = -nan;
        break;
      case 2:
        v[i] = inf;
        break;
      case 3:
        v[i] = -inf;
        break;
      case 4:
        v[i] = 0.0;
        break;
      case 5:
        v[i] = -0.0;
        break;
      default:
        v[i] = u(rng);
    }
  }
  return Tensor::from_doubles(shape, v, dtype);
}

inline Executor::Feeds mul_pair_feeds(const MulPairCase& c, uint32_t seed) {
  const int64_t n = c.rows * c.cols;
  std::mt19937 rng(seed);
  std::vector<double> bytes(static_cast<size_t>((n + 7) / 8));
  for (double& b : bytes) b = static_cast<double>(rng() & 0xffu);
  return {{"dy", special_values({c.rows, c.cols}, c.dtype, seed)},
          {"mask", Tensor::from_doubles({(n + 7) / 8}, bytes, DType::u8)},
          {"a", special_values(mul_pair_shape(c), c.dtype, seed + 1)},
          {"b", special_values(mul_pair_shape(c), c.dtype, seed + 2)}};
}

// Three Adam steps of the tiny bf16-mixed 8da4w Llama on `device`, compiled with and without
// fuse_ste_mul_pair: the same losses and every state bit for bit, and the pass's rewrites
// (one a layer: 2) where it ran.
inline void expect_llama_trains_as_without_mul_pair(Device device) {
  std::map<bool, std::vector<Tensor>> losses;
  std::map<bool, std::map<std::string, Tensor>> states;
  for (bool on : {false, true}) {
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, tiny_llama_config(), 2, 7, nn::parse_recipe("8da4w", 32),
                                       3, nn::PrecisionPolicy::bf16_mixed());
    CompileOptions options;
    options.device = device;
    if (!on) options.passes.disabled.insert("fuse_ste_mul_pair");
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, options);
    for (const PassRecord& r : step.passes())
      if (r.name == "fuse_ste_mul_pair") {
        EXPECT_EQ(r.rewrites, on ? 2 : 0);
      }
    for (int s = 0; s < 3; ++s)
      losses[on].push_back(step.train(tiny_llama_feeds(), {m.loss})[0].to(Device::cpu()));
    step.synchronize();
    for (const auto& [key, t] : state_index(step.executor()))
      states[on].emplace(key, t->to(Device::cpu()));
  }
  for (int s = 0; s < 3; ++s) EXPECT_EQ(first_difference(losses[false][s], losses[true][s]), "");
  ASSERT_EQ(states[false].size(), states[true].size());
  for (const auto& [key, t] : states[false]) {
    ASSERT_TRUE(states[true].count(key)) << key;
    EXPECT_EQ(first_difference(t, states[true].at(key)), "") << key;
  }
}

}  // namespace qg::testing
