// The fuse_scaled_softmax pass: mul(x, scale) -> softmax(axis -1) becomes one
// fused_scaled_softmax node and softmax_backward -> mul(g, scale) one
// fused_scaled_softmax_backward node; the fused graph's y and dx equal the unfused graph's bit
// for bit (CPU) in f32, f64, bf16 and f16 with NaN, infinities and signed zeros in the data,
// rows of 1 to 1500 elements, the scale either operand. Pairs that must stay apart stay apart,
// and the transformer QAT step trains identically with and without the pass.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "autograd/grad.h"
#include "ops/fused/scaled_softmax/scaled_softmax_fusion.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/scaled_softmax_graphs.h"
#include "tests/common/ste_step_graphs.h"

namespace qg {
namespace {

using testing::count_nodes;
using testing::first_difference;
using testing::original_node;
using testing::special_data;

const PassOptions kUnfused{{"fuse_scaled_softmax"}};

int rewrites(const std::vector<PassRecord>& records) {
  for (const PassRecord& r : records)
    if (r.name == "fuse_scaled_softmax") return r.rewrites;
  ADD_FAILURE() << "fuse_scaled_softmax is not in the default pipeline";
  return -1;
}

struct Case {
  DType dtype;
  int64_t len;
  bool scale_first;
  Shape scale_shape;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " len " << c.len << (c.scale_first ? " mul(s, x)" : " mul(x, s)")
      << " scale " << shape_str(c.scale_shape);
}

// y = softmax(mul(x, s)) over rows of c.len; loss = sum(y * w); dx = dloss/dx. y and dx named.
void build(Graph& g, const Case& c, double scale) {
  testing::build_scaled_softmax(g, c.dtype, {3, 2, c.len},
                                Tensor::from_doubles(c.scale_shape, {scale}, c.dtype),
                                c.scale_first);
}

class ScaledSoftmaxFusion : public ::testing::TestWithParam<Case> {};

TEST_P(ScaledSoftmaxFusion, FusedEqualsUnfusedBitForBit) {
  const Case& c = GetParam();
  // 0.125 (exact), 1/sqrt(48) (rounds in every dtype), -3 (flips the max) and 1e30 (overflows
  // to inf in f16/bf16/f32 products).
  for (double scale : {0.125, 1.0 / std::sqrt(48.0), -3.0, 1e30}) {
    Graph plain, fused;
    build(plain, c, scale);
    build(fused, c, scale);
    optimize(plain, kUnfused);
    ASSERT_EQ(rewrites(optimize(fused, PassOptions{})), 2);
    ASSERT_EQ(count_nodes(fused, "fused_scaled_softmax"), 1);
    ASSERT_EQ(count_nodes(fused, "fused_scaled_softmax_backward"), 1);
    ASSERT_EQ(count_nodes(fused, "softmax"), 0);
    ASSERT_EQ(count_nodes(fused, "softmax_backward"), 0);
    Executor ep(plain), ef(fused);
    const Shape shape = {3, 2, c.len};
    Executor::Feeds feeds = {{"x", special_data(shape, c.dtype, 7, 3.0)},
                             {"w", special_data(shape, c.dtype, 8, 1.0)}};
    auto a = ep.run(feeds, {plain.at("y"), plain.at("dx")});
    auto b = ef.run(feeds, {fused.at("y"), fused.at("dx")});
    EXPECT_EQ(first_difference(a[0], b[0]), "") << "y, scale " << scale;
    EXPECT_EQ(first_difference(a[1], b[1]), "") << "dx, scale " << scale;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (int64_t len : {1, 31, 32, 33, 512, 1000, 1500}) out.push_back({t, len, false, {}});
  out.push_back({DType::f32, 33, true, {}});
  out.push_back({DType::bf16, 512, true, {1}});
  out.push_back({DType::f64, 1000, false, {1, 1, 1}});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Rows, ScaledSoftmaxFusion, ::testing::ValuesIn(cases()));

// ---- pairs that stay apart -----------------------------------------------------------------

struct Pattern {
  Graph g;
  ValueId x, s, t, y;
};

void pattern(Pattern& p, const Shape& scale_shape = {}, int axis = -1) {
  p.x = p.g.input("x", {DType::f32, {4, 6}});
  p.s = p.g.constant(Tensor::from_doubles(
      scale_shape, std::vector<double>(shape_numel(scale_shape), 0.5), DType::f32));
  p.t = p.g.apply1("mul", {p.x, p.s});
  p.y = p.g.apply1("softmax", {p.t}, {{"axis", axis}});
  p.g.mark_output(p.y);
}

TEST(ScaledSoftmaxFusionLegality, FiresOnThePlainPattern) {
  Pattern p;
  pattern(p);
  EXPECT_EQ(scaled_softmax_blocker(p.g, p.g.value(p.t).producer, p.g.value(p.y).producer), "");
  EXPECT_EQ(rewrites(optimize(p.g, PassOptions{})), 1);
}

TEST(ScaledSoftmaxFusionLegality, ScaledValueWithAnotherReaderStaysApart) {
  Pattern p;
  pattern(p);
  p.g.mark_output(p.g.apply1("neg", {p.t}));
  EXPECT_NE(scaled_softmax_blocker(p.g, p.g.value(p.t).producer, p.g.value(p.y).producer), "");
  EXPECT_EQ(rewrites(optimize(p.g, PassOptions{})), 0);
}

TEST(ScaledSoftmaxFusionLegality, ScaledValueThatIsAnOutputOrNamedStaysApart) {
  Pattern a, b;
  pattern(a);
  pattern(b);
  a.g.mark_output(a.t);
  b.g.set_name(b.t, "scaled");
  EXPECT_EQ(rewrites(optimize(a.g, PassOptions{})), 0);
  EXPECT_EQ(rewrites(optimize(b.g, PassOptions{})), 0);
}

TEST(ScaledSoftmaxFusionLegality, NonScalarMulAndOtherAxesStayApart) {
  Pattern row, other_axis, grows;
  pattern(row, {6});           // a per-column scale is not a scalar
  pattern(other_axis, {}, 0);  // softmax along the first axis
  pattern(grows, {1, 1, 1});   // a one-element scale of higher rank broadcasts x to [1, 4, 6]
  EXPECT_EQ(rewrites(optimize(row.g, PassOptions{})), 0);
  EXPECT_EQ(rewrites(optimize(other_axis.g, PassOptions{})), 0);
  EXPECT_EQ(rewrites(optimize(grows.g, PassOptions{})), 0);
}

TEST(ScaledSoftmaxFusionLegality, BackwardMulWithAnotherReaderStaysApart) {
  Graph g;
  ValueId dy = g.input("dy", {DType::f32, {4, 6}});
  ValueId y = g.input("y", {DType::f32, {4, 6}});
  ValueId s = g.constant(Tensor::scalar(0.5, DType::f32));
  ValueId d = g.apply1("softmax_backward", {dy, y}, {{"axis", -1}});
  g.mark_output(g.apply1("mul", {d, s}));
  g.mark_output(g.apply1("neg", {d}));
  EXPECT_EQ(rewrites(optimize(g, PassOptions{})), 0);
}

TEST(ScaledSoftmaxFusionErrors, FusedNodesCannotBeAppliedDirectly) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3}});
  ValueId s = g.constant(Tensor::scalar(0.5, DType::f32));
  for (const char* op : {"fused_scaled_softmax", "fused_scaled_softmax_backward"}) {
    try {
      std::vector<ValueId> in = {x, s};
      if (std::string(op) == "fused_scaled_softmax_backward") in = {x, x, s};
      g.apply1(op, in);
      ADD_FAILURE() << op << " was applied";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fuse_scaled_softmax pass"), std::string::npos);
    }
  }
}

// Hand-built fused nodes (the pass never builds these): each bad input is a qg::Error from
// the kernels' check naming the op and what is wrong, not a silently wrong scale.
TEST(ScaledSoftmaxFusionErrors, KernelsRejectBadInputs) {
  struct Bad {
    std::string op, label, expect;
    std::vector<std::string> inputs;  // of the names below
    std::vector<Node> from;
  };
  const Node mul = original_node("mul"), softmax = original_node("softmax", {{"axis", -1}});
  const Node softmax_backward = original_node("softmax_backward", {{"axis", -1}});
  const std::string fwd = "fused_scaled_softmax", bwd = "fused_scaled_softmax_backward";
  const std::vector<Bad> cases = {
      {fwd, "a scale of 3 elements", "scale", {"x", "s3"}, {mul, softmax}},
      {fwd, "an f64 scale", "scale", {"x", "s_f64"}, {mul, softmax}},
      {fwd, "x of another shape", "input 0", {"x_other", "s"}, {mul, softmax}},
      {fwd, "a scale missing", "takes 2 inputs", {"x"}, {mul, softmax}},
      {fwd, "fused_from reversed", "fused_from", {"x", "s"}, {softmax, mul}},
      {bwd, "y of another shape", "input 1", {"x", "x_other", "s"}, {softmax_backward, mul}},
      {bwd, "a scale of 3 elements", "scale", {"x", "x", "s3"}, {softmax_backward, mul}},
      {bwd, "fused_from of the forward", "fused_from", {"x", "x", "s"}, {mul, softmax}},
  };
  for (const Bad& c : cases) {
    Graph g;
    std::map<std::string, TensorType> types = {
        {"x", {DType::f32, {2, 8}}}, {"x_other", {DType::f32, {4, 4}}}, {"s", {DType::f32, {}}},
        {"s3", {DType::f32, {3}}},   {"s_f64", {DType::f64, {}}},
    };
    Executor::Feeds feeds;
    Node fused;
    fused.op = &OpRegistry::instance().get(c.op);
    fused.name = "bad";
    fused.attrs = resolve_attrs(*fused.op, {});
    for (const std::string& name : c.inputs) {
      if (!feeds.count(name)) {
        g.input(name, types.at(name));
        feeds[name] = Tensor::zeros(types.at(name).shape, types.at(name).dtype);
      }
      fused.inputs.push_back(g.at(name));
    }
    fused.fused_from = c.from;
    // Each original reads a value of input 0's type, as a pass records it: the parts' parsers
    // (softmax's columns, permute's plan) lay their arguments out over it.
    if (!fused.inputs.empty())
      for (Node& n : fused.fused_from) n.inputs = {fused.inputs[0]};
    const ValueId out = g.node(g.add_raw_node(fused, {{DType::f32, {2, 8}}})).outputs[0];
    try {
      Executor(g).run(feeds, {out});
      ADD_FAILURE() << "expected qg::Error for " << c.label;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c.op), std::string::npos) << c.label << ": " << what;
      EXPECT_NE(what.find(c.expect), std::string::npos) << c.label << ": " << what;
    }
  }
}

// ---- the transformer step ------------------------------------------------------------------

TEST(ScaledSoftmaxFusionTransformer, QatStepTrainsIdenticallyWithAndWithoutThePass) {
  testing::TransformerStep plain, fused;
  testing::build_transformer_step(plain);
  testing::build_transformer_step(fused);
  optimize(plain.g, kUnfused);
  EXPECT_EQ(rewrites(optimize(fused.g, PassOptions{})), 2);  // the block's one attention
  EXPECT_EQ(count_nodes(fused.g, "fused_scaled_softmax"), 1);
  EXPECT_EQ(count_nodes(fused.g, "fused_scaled_softmax_backward"), 1);
  testing::expect_trains_identically(plain, fused, Device::cpu());
}

}  // namespace
}  // namespace qg
