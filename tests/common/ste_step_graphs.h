// Graphs for the fuse_ste_optimizer / fuse_ste_chain tests (tests/passes on the CPU,
// tests/gpu_fused on the GPU): a fake-quantized weight trained by sgd or adam, a value
// fake-quantized twice, and the `qat steps` transformer QAT training step at small shapes.
#pragma once

#include <cmath>
#include <cstring>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "autograd/grad.h"
#include "nn/builder.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/tensor_compare.h"
#include "train/optimizer.h"

namespace qg::testing {

// Normal(0, spread) data with NaN, infinities and signed zeros at fixed positions (when there
// are at least 16 elements, and every 997 elements after that).
inline Tensor special_data(const Shape& shape, DType dtype, uint64_t seed, double spread = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, spread);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  for (size_t i = 0; i + 16 <= v.size(); i += 997) {
    v[i + 1] = -0.0;
    v[i + 3] = 0.0;
    v[i + 6] = NAN;
    v[i + 9] = INFINITY;
    v[i + 12] = -INFINITY;
  }
  return Tensor::from_doubles(shape, v, dtype);
}

struct WeightCase {
  DType dtype;
  bool per_channel;
  nn::OptimizerConfig optimizer;
  Shape shape;
};

inline std::string describe(const WeightCase& c) {
  return std::string(dtype_name(c.dtype)) + (c.per_channel ? " per-channel " : " per-tensor ") +
         c.optimizer.kind + " momentum " + std::to_string(c.optimizer.momentum) + " wd " +
         std::to_string(c.optimizer.weight_decay) + " n=" + std::to_string(shape_numel(c.shape));
}

inline void PrintTo(const WeightCase& c, std::ostream* os) {
  *os << describe(c);
}

struct WeightStep {
  Graph g;
  ValueId loss = kNoValue;
  NodeId step = -1;
};

// w (a parameter) -> fake_quantize (signed int8, constant qparams that put some weights out of
// range) -> loss = sum(wq * x) -> nn::add_optimizer. The gradient of wq is x, NaN and all.
inline void build_weight_step(WeightStep& s, const WeightCase& c) {
  const int64_t rows = c.shape.at(0);
  ValueId w = s.g.parameter("w", special_data(c.shape, c.dtype, 1, 1.0));
  ValueId x = s.g.input("x", {c.dtype, c.shape});
  Attrs fq_attrs = {{"signed", true}};
  Shape qshape = {1};
  std::vector<double> scales = {0.01};
  if (c.per_channel) {
    fq_attrs = {{"signed", true}, {"scope", "channel"}, {"axis", 0}};
    qshape = {rows};
    scales.clear();
    for (int64_t r = 0; r < rows; ++r) scales.push_back(0.004 * static_cast<double>(r + 1));
  }
  ValueId scale = s.g.constant(Tensor::from_doubles(qshape, scales, DType::f32));
  ValueId zp = s.g.constant(
      Tensor::from_doubles(qshape, std::vector<double>(scales.size(), 0.0), DType::i32));
  auto fq = s.g.apply("fake_quantize", {w, scale, zp}, fq_attrs, "w.fq");
  s.loss = s.g.apply1("sum", {s.g.apply1("mul", {fq[0], x})});
  s.step = nn::add_optimizer(s.g, s.loss, {w}, c.optimizer).at(0);
}

// x -> fake_quantize -> fake_quantize -> sum(y * w); dx (named "dx") = the two STE masks
// applied to w. The first quantizer is per-tensor (unsigned 8-bit, zero point 128), the second
// per-tensor or per-channel on axis 0 (signed 8-bit): different x, qparams and ranges.
inline ValueId build_double_quantize(Graph& g, DType dtype, const Shape& shape, bool per_channel) {
  ValueId x = g.input("x", {dtype, shape});
  ValueId w = g.input("w", {dtype, shape});
  ValueId s1 = g.constant(Tensor::from_doubles({1}, {0.02}, DType::f32));
  ValueId z1 = g.constant(Tensor::from_doubles({1}, {128}, DType::i32));
  auto q1 = g.apply("fake_quantize", {x, s1, z1});
  Attrs a2 = {{"signed", true}};
  Shape qs = {1};
  std::vector<double> scales = {0.015};
  if (per_channel) {
    a2 = {{"signed", true}, {"scope", "channel"}, {"axis", 0}};
    qs = {shape.at(0)};
    scales.clear();
    for (int64_t r = 0; r < shape.at(0); ++r) scales.push_back(0.006 * static_cast<double>(r + 1));
  }
  ValueId s2 = g.constant(Tensor::from_doubles(qs, scales, DType::f32));
  ValueId z2 =
      g.constant(Tensor::from_doubles(qs, std::vector<double>(scales.size(), 0.0), DType::i32));
  auto q2 = g.apply("fake_quantize", {q1[0], s2, z2}, a2);
  ValueId dx = grad(g, g.apply1("sum", {g.apply1("mul", {q2[0], w})}), {x})[0];
  g.set_name(dx, "dx");
  return dx;
}

struct TransformerStep {
  Graph g;
  ValueId loss = kNoValue;
  std::vector<NodeId> updates;
  std::map<std::string, Tensor> feeds;
};

// `qat steps`' transformer QAT step (apps/qat/steps_command.cpp) at its --small shapes: one
// pre-norm block, W8A8, a linear head on every token, cross-entropy, SGD (lr 0.01, no momentum).
inline void build_transformer_step(TransformerStep& s) {
  const int64_t batch = 2, seq = 8, d = 32, heads = 4, mlp = 4 * d;
  nn::Builder b(s.g, nn::QConfig::w8a8(), 1);
  ValueId x = s.g.input("x", {DType::f32, {batch, seq, d}});
  ValueId labels = s.g.input("labels", {DType::i64, {batch * seq}});
  ValueId h = b.transformer_block(b.quant_input(x), heads, mlp, "block");
  ValueId logits = b.linear(h, 10, "head", false, true);
  logits = s.g.apply1("reshape", {logits}, {{"shape", Shape{batch * seq, 10}}}, "tokens");
  s.loss = b.cross_entropy(logits, labels);
  s.updates = nn::add_optimizer(s.g, s.loss, b.parameters(), {"sgd", 0.01, 0.0});
  std::vector<double> lab(static_cast<size_t>(batch * seq));
  for (size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<double>((i * 7) % 10);
  // Uniform input without specials: one NaN would make every loss NaN.
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> xs(static_cast<size_t>(batch * seq * d));
  for (auto& v : xs) v = u(rng);
  s.feeds = {{"x", Tensor::from_doubles({batch, seq, d}, xs, DType::f32)},
             {"labels", Tensor::from_doubles({batch * seq}, lab, DType::i64)}};
}

// Runs `plain` and `fused` (the same step, optimized differently) for `steps` training steps
// on `device` and expects the same loss bits every step and the same parameters at the end.
inline void expect_trains_identically(TransformerStep& plain, TransformerStep& fused, Device device,
                                      int steps = 3) {
  Executor ep(plain.g, device), ef(fused.g, device);
  for (int i = 0; i < steps; ++i) {
    Tensor lp = ep.run(plain.feeds, {plain.loss}, plain.updates)[0];
    Tensor lf = ef.run(fused.feeds, {fused.loss}, fused.updates)[0];
    EXPECT_EQ(first_difference(lp, lf), "") << "loss, step " << i;
    ASSERT_TRUE(std::isfinite(lf.to(Device::cpu()).at(0))) << "loss, step " << i;
  }
  for (NodeId p : plain.g.parameters())
    EXPECT_EQ(first_difference(ep.states(p).at(0), ef.states(p).at(0)), "") << plain.g.node(p).name;
}

// The rewrites the pass `name` made, as optimize() recorded them (-1, and a test failure, when
// the pipeline has no such pass).
inline int pass_rewrites(const std::vector<PassRecord>& records, const std::string& name) {
  for (const PassRecord& r : records)
    if (r.name == name) return r.rewrites;
  ADD_FAILURE() << name << " is not in the default pipeline";
  return -1;
}

// A node of `op` with `attrs` resolved, not in any graph: a part a hand-built fused node
// records as its original (the fusion tests' bad-input cases).
inline Node original_node(const std::string& op, const Attrs& attrs = {}) {
  Node n;
  n.op = &OpRegistry::instance().get(op);
  n.attrs = resolve_attrs(*n.op, attrs);
  return n;
}

inline int count_nodes(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id : g.topological_order()) n += g.node(id).op->name == op;
  return n;
}

}  // namespace qg::testing
