// PrecisionPolicy: defaults, validation, names read back by parse_precision; the Builder's
// graphs unchanged under the default policy, and under bf16-mixed a linear layer whose input,
// weight and bias are cast to bf16 after the quantizers, training one step on the CPU with
// f32 parameters and gradients.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/builder.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;

TEST(PrecisionPolicy, DefaultsValidationAndNames) {
  nn::PrecisionPolicy p;
  EXPECT_EQ(p.parameter, DType::f32);
  EXPECT_EQ(p.compute, DType::f32);
  EXPECT_EQ(p.accumulate, DType::f32);
  EXPECT_FALSE(p.mixed());
  p.validate();
  EXPECT_EQ(p.name(), "f32");
  EXPECT_EQ(nn::PrecisionPolicy::bf16_mixed().str(),
            "bf16-mixed (parameters f32, compute bf16, accumulate f32)");
  EXPECT_TRUE(nn::PrecisionPolicy::bf16_mixed().mixed());

  for (const char* name : {"f32", "f64", "bf16", "f16", "bf16-mixed", "f16-mixed"})
    EXPECT_EQ(nn::parse_precision(name).name(), name);
  nn::PrecisionPolicy custom = nn::parse_precision("f32/bf16/f64");
  EXPECT_EQ(custom.compute, DType::bf16);
  EXPECT_EQ(custom.accumulate, DType::f64);
  EXPECT_EQ(custom.name(), "f32/bf16/f64");
  EXPECT_EQ(nn::parse_precision(custom.name()), custom);

  expect_error(
      [] {
        nn::PrecisionPolicy{DType::f32, DType::bf16, DType::bf16}.validate();
      },
      {"[precision]", "accumulate dtype bf16 is not one of f32, f64"});
  expect_error(
      [] {
        nn::PrecisionPolicy{DType::f32, DType::i8, DType::f32}.validate();
      },
      {"[precision]", "compute dtype i8"});
  expect_error(
      [] {
        nn::PrecisionPolicy{DType::u8, DType::f32, DType::f32}.validate();
      },
      {"[precision]", "parameter dtype u8"});
  expect_error(
      [] {
        nn::PrecisionPolicy{DType::f64, DType::f64, DType::f32}.validate();
      },
      {"[precision]", "narrower than compute dtype f64"});
  expect_error(
      [] { nn::parse_precision("bf16_mixed"); },
      {"[precision]", "'bf16_mixed' is not one of", "bf16-mixed", "PARAM/COMPUTE/ACCUMULATE"});
  expect_error([] { nn::parse_precision("f32/q7/f32"); }, {"[precision]", "f32/q7/f32", "q7"});
  expect_error([] { nn::parse_precision("f32/f32/f16"); }, {"accumulate dtype f16"});
  Graph g;
  expect_error(
      [&] {
        nn::Builder(g, nn::QConfig::float32(), 1, {DType::f32, DType::f32, DType::i32});
      },
      {"[precision]", "accumulate dtype i32"});
}

int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (NodeId id = 0; id < g.num_nodes(); ++id) n += g.node(id).op->name == op ? 1 : 0;
  return n;
}

// The node named `name` (layers name their nodes "<layer>.<part>").
const Node* node_named(const Graph& g, const std::string& name) {
  for (NodeId id = 0; id < g.num_nodes(); ++id)
    if (g.node(id).name == name) return &g.node(id);
  return nullptr;
}

// fc1 (ReLU) -> fc2 -> cross entropy on a [4, 6] batch, W8A8 so the quantizers are present.
ValueId build_mlp(Graph& g, nn::Builder& b) {
  ValueId x = g.input("x", {DType::f32, {4, 6}});
  ValueId labels = g.input("labels", {DType::i64, {4}});
  ValueId h = b.linear(b.quant_input(x), 5, "fc1", true, true);
  return b.cross_entropy(b.linear(h, 3, "fc2", false, false), labels);
}

TEST(PrecisionPolicy, TheDefaultPolicyBuildsTheSameGraph) {
  Graph plain, with_policy;
  nn::Builder b1(plain, nn::QConfig::w8a8(), 7);
  nn::Builder b2(with_policy, nn::QConfig::w8a8(), 7, nn::PrecisionPolicy::f32());
  build_mlp(plain, b1);
  build_mlp(with_policy, b2);
  EXPECT_EQ(count_op(with_policy, "cast"), 0);
  EXPECT_EQ(plain.dump(), with_policy.dump());
}

TEST(PrecisionPolicy, Bf16MixedCastsTheGemmOperandsAndTrainsAStep) {
  Graph g;
  nn::Builder b(g, nn::QConfig::w8a8(), 7, nn::PrecisionPolicy::bf16_mixed());
  ValueId loss = build_mlp(g, b);
  // Each layer casts its (fake-quantized) weight and its bias; fc1 its f32 input too, while
  // fc2's input, fc1's output, is bf16 already.
  EXPECT_EQ(count_op(g, "cast"), 5);
  EXPECT_NE(node_named(g, "fc1.in.to_compute"), nullptr);
  EXPECT_EQ(node_named(g, "fc2.in.to_compute"), nullptr);
  for (const char* layer : {"fc1", "fc2"}) {
    SCOPED_TRACE(layer);
    const std::string name = layer;
    const Node* w = node_named(g, name + ".weight.to_compute");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->op->name, "cast");
    EXPECT_EQ(w->attrs.get_string("dtype"), "bf16");
    // The weight quantizer reads the f32 master weight; the cast follows it.
    EXPECT_EQ(g.node(g.value(w->inputs[0]).producer).op->name, "fake_quantize");
    EXPECT_EQ(g.value(w->inputs[0]).type.dtype, DType::f32);
    EXPECT_NE(node_named(g, name + ".bias.to_compute"), nullptr);
    const Node* mm = node_named(g, name + ".matmul");
    ASSERT_NE(mm, nullptr);
    EXPECT_EQ(g.value(mm->outputs[0]).type.dtype, DType::bf16);
  }
  for (ValueId p : b.parameters()) EXPECT_EQ(g.value(p).type.dtype, DType::f32);
  // The loss of bf16 logits is f32 (softmax_cross_entropy's rule, as torch.autocast's).
  EXPECT_EQ(g.value(loss).type.dtype, DType::f32);

  // One SGD step on the CPU: the gradients reach the f32 parameters through the casts.
  nn::OptimizerConfig opt;
  opt.kind = "sgd";
  opt.lr = 0.5;
  std::vector<NodeId> steps = nn::add_optimizer(g, loss, b.parameters(), opt);
  Executor exec(g);
  std::vector<double> xv(24);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.7 * static_cast<double>(i));
  Executor::Feeds feeds{{"x", Tensor::from_doubles({4, 6}, xv, DType::f32)},
                        {"labels", Tensor::from_doubles({4}, {0, 1, 2, 1}, DType::i64)}};
  const NodeId fc1_weight = g.value(g.find("fc1.weight")).producer;
  std::vector<double> before = exec.state(fc1_weight, "value").to_doubles();
  const double loss0 = exec.run(feeds, {loss}, steps)[0].at(0);
  std::vector<double> after = exec.state(fc1_weight, "value").to_doubles();
  EXPECT_EQ(exec.state(fc1_weight, "value").dtype(), DType::f32);
  EXPECT_TRUE(std::isfinite(loss0));
  EXPECT_NE(before, after);
  for (double v : after) EXPECT_TRUE(std::isfinite(v));
  const double loss1 = exec.run(feeds, {loss})[0].at(0);
  EXPECT_LT(loss1, loss0);
}

}  // namespace
}  // namespace qg
