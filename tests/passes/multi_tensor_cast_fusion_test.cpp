// The fuse_multi_tensor_cast pass (ops/fused/multi_tensor_cast/): the casts of f32 parameters
// to one narrower dtype become one fused_multi_tensor_cast node whose outputs are the unfused
// casts' bit for bit, on the CPU and the GPU (sizes under 8 elements, with a tail, and large
// ones; NaN, infinities, signed zeros, values that round to infinity and halfway cases). Casts
// to another dtype or of values that are not parameters stay as they are; a lone cast is left
// alone; the bf16-mixed Llama trains bit for bit the same with and without the pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nn/llama.h"
#include "nn/qconfig.h"
#include "ops/fused/multi_tensor_cast/multi_tensor_cast.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/tensor_compare.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::first_difference;

const PassOptions kUnfused{{"fuse_multi_tensor_cast"}};

Tensor weights(const Shape& shape, uint32_t seed) {
  Tensor t = testing::random_f32(shape, seed);
  float* p = t.data<float>();
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            3.4e38f,               // past bf16's largest: rounds to inf
                            1.0f + 1.0f / 256.0f,  // halfway between two bf16 values
                            1.0f + 3.0f / 256.0f,  // halfway, rounds up to even
                            1e-40f};
  for (int64_t i = 0; i < t.numel(); i += 3) p[i] = specials[(i / 3 + seed) % 7];
  return t;
}

// Three f32 parameters cast to bf16 (fused), one cast to f16 (a group of one: left), and a
// cast of a graph input (not a parameter: left). Every cast output is fetched.
void build(Graph& g) {
  const std::vector<Shape> shapes = {{5}, {7, 3}, {41, 100}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    ValueId p = g.parameter("p" + std::to_string(i), weights(shapes[i], 3 + i));
    ValueId y = g.apply1("cast", {p}, {{"dtype", std::string("bf16")}});
    g.set_name(y, "y" + std::to_string(i));
    g.mark_output(y);
  }
  ValueId q = g.parameter("q", weights({9}, 11));
  ValueId h = g.apply1("cast", {q}, {{"dtype", std::string("f16")}});
  g.set_name(h, "h");
  g.mark_output(h);
  ValueId x = g.input("x", {DType::f32, {6}});
  ValueId z = g.apply1("cast", {x}, {{"dtype", std::string("bf16")}});
  g.set_name(z, "z");
  g.mark_output(z);
}

std::vector<Tensor> fetch_all(const Graph& g, Executor& ex) {
  std::vector<ValueId> ids;
  for (const char* name : {"y0", "y1", "y2", "h", "z"}) ids.push_back(g.at(name));
  std::vector<Tensor> out = ex.run({{"x", weights({6}, 13)}}, ids);
  for (Tensor& t : out) t = t.to(Device::cpu());
  return out;
}

int rewrites(const std::vector<PassRecord>& records) {
  for (const PassRecord& r : records)
    if (r.name == "fuse_multi_tensor_cast") return r.rewrites;
  return -1;
}

TEST(MultiTensorCastFusion, FusedNodeEqualsUnfusedCastsBitForBit) {
  Graph plain, fused;
  build(plain);
  build(fused);
  optimize(plain, kUnfused);
  EXPECT_EQ(rewrites(optimize(fused, PassOptions{})), 1);
  EXPECT_EQ(testing::count_live_ops(fused, "fused_multi_tensor_cast"), 1);
  EXPECT_EQ(testing::count_live_ops(fused, "cast"), 2);  // the f16 cast and the input's
  Executor ep(plain), ef(fused);
  const std::vector<Tensor> a = fetch_all(plain, ep), b = fetch_all(fused, ef);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(first_difference(a[i], b[i]), "") << i;
}

TEST(MultiTensorCastFusion, GpuEqualsUnfusedGpuAndTheCpu) {
  QG_REQUIRE_GPU();
  Graph plain, fused;
  build(plain);
  build(fused);
  optimize(plain, kUnfused);
  optimize(fused, PassOptions{});
  Executor ep(plain, Device::cuda()), ef(fused, Device::cuda()), cpu(plain);
  const std::vector<Tensor> a = fetch_all(plain, ep), b = fetch_all(fused, ef),
                            c = fetch_all(plain, cpu);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(first_difference(a[i], b[i]), "") << i;
    EXPECT_EQ(first_difference(c[i], b[i]), "") << "against the CPU, " << i;
  }
}

TEST(MultiTensorCastFusion, StandsBackWhereItMust) {
  Graph g;
  ValueId p0 = g.parameter("p0", weights({4}, 1));
  ValueId p1 = g.parameter("p1", weights({4}, 2));
  ValueId c0 = g.apply1("cast", {p0}, {{"dtype", std::string("bf16")}});
  ValueId c1 = g.apply1("cast", {p1}, {{"dtype", std::string("bf16")}});
  const NodeId n0 = g.value(c0).producer, n1 = g.value(c1).producer;
  EXPECT_EQ(multi_tensor_cast_blocker(g, {n0, n1}), "");
  EXPECT_EQ(multi_tensor_cast_blocker(g, {n0}), "fewer than two casts");
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId c2 = g.apply1("cast", {x}, {{"dtype", std::string("bf16")}});
  EXPECT_NE(multi_tensor_cast_blocker(g, {n0, g.value(c2).producer}).find("not an f32 parameter"),
            std::string::npos);
  const NodeId relu = g.value(g.apply1("relu", {x})).producer;
  g.add_control_dependency(relu, n1);
  EXPECT_NE(multi_tensor_cast_blocker(g, {n0, n1}).find("is ordered after node"),
            std::string::npos);
}

// Hand-built fused nodes (the pass never builds these): an output of another dtype or shape
// than its part's, or a part that is not a cast, is a qg::Error naming the op.
TEST(MultiTensorCastFusion, KernelRejectsBadInputs) {
  struct Bad {
    std::string expect;
    TensorType out1;
    const char* part1;
  };
  const std::vector<Bad> cases = {{"part 1", {DType::f16, {4}}, "cast"},
                                  {"part 1", {DType::bf16, {5}}, "cast"},
                                  {"not a cast", {DType::bf16, {4}}, "relu"}};
  for (const Bad& c : cases) {
    Graph g;
    ValueId p0 = g.input("p0", {DType::f32, {4}});
    ValueId p1 = g.input("p1", {DType::f32, {4}});
    Node fused;
    fused.op = &OpRegistry::instance().get("fused_multi_tensor_cast");
    fused.name = "bad";
    fused.inputs = {p0, p1};
    for (const char* op : {"cast", c.part1}) {
      Node part;
      part.op = &OpRegistry::instance().get(op);
      if (std::string(op) == "cast") part.attrs = {{"dtype", std::string("bf16")}};
      part.inputs = {p0};
      fused.fused_from.push_back(part);
    }
    const NodeId id = g.add_raw_node(fused, {{DType::bf16, {4}}, c.out1});
    const Executor::Feeds in = {{"p0", Tensor::zeros({4}, DType::f32)},
                                {"p1", Tensor::zeros({4}, DType::f32)}};
    SCOPED_TRACE(c.expect);
    testing::expect_error([&] { Executor(g).run(in, {g.node(id).outputs[0]}); },
                          {"fused_multi_tensor_cast", c.expect});
  }
}

TEST(MultiTensorCastFusion, FusedNodeCannotBeAppliedDirectly) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {8}});
  testing::expect_error(
      [&] {
        g.apply("fused_multi_tensor_cast", {a, a});
      },
      {"fused_multi_tensor_cast", "fuse_multi_tensor_cast pass"});
}

// The bf16-mixed float Llama: its 15 weights' compute copies come from one node; the losses and
// every state after Adam steps are bit for bit those of the unfused step.
void expect_llama_unchanged(Device device) {
  const nn::LlamaConfig config = testing::tiny_llama_config();
  auto run = [&](bool fuse, int* count, int* parts) {
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, config, 2, 7, nn::parse_recipe("float", 32), 5,
                                       nn::parse_precision("bf16-mixed"));
    CompileOptions options;
    options.device = device;
    if (!fuse) options.passes.disabled.insert("fuse_multi_tensor_cast");
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adam", 1e-2}), {}}, options);
    std::vector<Tensor> out;
    for (int s = 0; s < 3; ++s)
      out.push_back(step.train(testing::tiny_llama_feeds(), {m.loss})[0].to(Device::cpu()));
    step.synchronize();
    *count = rewrites(step.passes());
    *parts = 0;
    const Graph& compiled = step.executor().graph();
    for (NodeId id = 0; id < compiled.num_nodes(); ++id)
      if (!compiled.node(id).dead && compiled.node(id).op->name == "fused_multi_tensor_cast")
        *parts += static_cast<int>(compiled.node(id).fused_from.size());
    for (const auto& [key, t] : state_index(step.executor())) out.push_back(t->to(Device::cpu()));
    return out;
  };
  int fused_count = -1, plain_count = -1, fused_parts = -1, plain_parts = -1;
  const std::vector<Tensor> fused = run(true, &fused_count, &fused_parts);
  const std::vector<Tensor> plain = run(false, &plain_count, &plain_parts);
  EXPECT_EQ(fused_count, 1);
  EXPECT_EQ(fused_parts, 2 * 7 + 1);
  EXPECT_EQ(plain_count, 0);
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_EQ(first_difference(fused[i], plain[i]), "") << i;
}

TEST(MultiTensorCastFusion, MixedPrecisionLlamaTrainsBitForBitTheSame) {
  expect_llama_unchanged(Device::cpu());
}

TEST(MultiTensorCastFusion, GpuMixedPrecisionLlamaTrainsBitForBitTheSame) {
  QG_REQUIRE_GPU();
  expect_llama_unchanged(Device::cuda());
}

}  // namespace
}  // namespace qg
