// The fuse_multi_tensor_adam pass (ops/fused/multi_tensor_adam/): the adam steps sharing their
// hyper-parameters and their parameter and gradient dtypes become one fused_multi_tensor_adam
// node per group, whose updates (parameters, moments, step counters) equal the unfused steps'
// bit for bit on the CPU and the GPU, over several steps, with f32 and bf16 gradients and
// weight decay. A step alone in its group stays as it is; checkpoint keys are unchanged; the
// bf16-mixed Llama trains bit for bit the same with and without the pass.
#include <gtest/gtest.h>

#include "nn/llama.h"
#include "nn/qconfig.h"
#include "ops/fused/multi_tensor_adam/multi_tensor_adam.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "runtime/executor.h"
#include "runtime/passes/pass.h"
#include "tests/common/llama_pass_check.h"
#include "tests/common/tensor_compare.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::first_difference;

struct Param {
  Shape shape;
  DType param, grad;
};

const std::vector<Param>& params() {
  static const std::vector<Param> p = {
      {{5}, DType::f32, DType::f32},        {{1031}, DType::f32, DType::f32},
      {{3, 1000}, DType::f32, DType::f32},  {{7, 33}, DType::f32, DType::bf16},
      {{2, 2050}, DType::f32, DType::bf16}, {{9}, DType::f64, DType::f64}};
  return p;
}

// Each parameter stepped by adam (weight decay 0.01) with its gradient fed as an input; returns
// the parameters and every state after three steps, by name.
std::map<std::string, Tensor> run(bool fuse, Device device, int* rewrites) {
  Graph g;
  std::vector<NodeId> steps;
  for (size_t i = 0; i < params().size(); ++i) {
    const Param& p = params()[i];
    const std::string name = "p" + std::to_string(i);
    ValueId w = g.parameter(name, testing::random_f32(p.shape, 3 + i).cast(p.param));
    ValueId grad = g.input("g" + std::to_string(i), {p.grad, p.shape});
    g.apply("adam", {w, grad}, {{"lr", 1e-2}, {"weight_decay", 0.01}}, name + ".adam");
    steps.push_back(g.num_nodes() - 1);
  }
  PassOptions options;
  if (!fuse) options.disabled.insert("fuse_multi_tensor_adam");
  for (const PassRecord& r : optimize(g, options))
    if (r.name == "fuse_multi_tensor_adam") *rewrites = r.rewrites;
  std::vector<NodeId> targets;
  for (NodeId s : steps) {
    const NodeId live = live_node(g, s);
    if (std::find(targets.begin(), targets.end(), live) == targets.end()) targets.push_back(live);
  }
  Executor ex(g, device);
  for (uint32_t s = 0; s < 3; ++s) {
    Executor::Feeds feeds;
    for (size_t i = 0; i < params().size(); ++i)
      feeds["g" + std::to_string(i)] =
          testing::random_f32(params()[i].shape, 40 + 7 * s + i).cast(params()[i].grad);
    ex.run(feeds, {}, targets);
  }
  std::map<std::string, Tensor> out;
  for (const auto& [key, t] : state_index(ex)) out[key] = t->to(Device::cpu());
  return out;
}

void expect_same(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [key, t] : a) {
    ASSERT_TRUE(b.count(key)) << what << ": " << key;
    EXPECT_EQ(first_difference(t, b.at(key)), "") << what << ": " << key;
  }
}

TEST(MultiTensorAdamFusion, FusedStepsEqualUnfusedStepsBitForBit) {
  int fused_rewrites = -1, plain_rewrites = -1;
  const auto fused = run(true, Device::cpu(), &fused_rewrites);
  const auto plain = run(false, Device::cpu(), &plain_rewrites);
  // Two groups: the f32 gradients and the bf16 ones; the f64 step is alone in its group.
  EXPECT_EQ(fused_rewrites, 2);
  EXPECT_EQ(plain_rewrites, 0);
  expect_same(plain, fused, "CPU");
}

TEST(MultiTensorAdamFusion, GpuEqualsUnfusedGpuAndTheCpu) {
  QG_REQUIRE_GPU();
  int rewrites = -1;
  const auto fused = run(true, Device::cuda(), &rewrites);
  expect_same(run(false, Device::cuda(), &rewrites), fused, "GPU unfused");
  expect_same(run(false, Device::cpu(), &rewrites), fused, "CPU");
}

TEST(MultiTensorAdamFusion, StandsBackWhereItMust) {
  Graph g;
  ValueId p = g.parameter("p", Tensor::zeros({4}, DType::f32));
  ValueId grad = g.input("g", {DType::f32, {4}});
  g.apply("sgd", {p, grad});
  const NodeId sgd = g.num_nodes() - 1;
  EXPECT_EQ(multi_tensor_adam_blocker(g, {sgd}),
            "node '" + g.node(sgd).name + "' is not a live adam step");
  testing::expect_error(
      [&] {
        g.apply("fused_multi_tensor_adam", {p, grad});
      },
      {"fused_multi_tensor_adam", "fuse_multi_tensor_adam pass"});
}

// Data parallelism: steps whose gradients wait on different gradient all-reduces (async
// collectives) stay in different groups, so the steps of an early bucket do not wait for the
// last bucket's all-reduce; steps behind the same all-reduce still merge.
TEST(MultiTensorAdamFusion, StepsBehindDifferentAllReducesStayApart) {
  for (const bool buckets : {false, true}) {
    Graph g;
    std::vector<ValueId> reduced;
    for (int b = 0; b < 2; ++b) {
      ValueId grad = g.input("g" + std::to_string(b), {DType::f32, {4}});
      reduced.push_back(buckets ? g.apply("all_reduce", {grad})[0] : grad);
    }
    for (int i = 0; i < 4; ++i)
      g.apply(
          "adam",
          {g.parameter("p" + std::to_string(i), Tensor::zeros({4}, DType::f32)), reduced[i / 2]},
          {{"lr", 1e-2}}, "p" + std::to_string(i) + ".adam");
    int rewrites = -1;
    for (const PassRecord& r : optimize(g, PassOptions{}))
      if (r.name == "fuse_multi_tensor_adam") rewrites = r.rewrites;
    int fused = 0, inputs = 0;
    for (NodeId id = 0; id < g.num_nodes(); ++id)
      if (!g.node(id).dead && g.node(id).op->name == "fused_multi_tensor_adam") {
        ++fused;
        inputs += static_cast<int>(g.node(id).inputs.size());
      }
    EXPECT_EQ(rewrites, buckets ? 2 : 1) << "buckets " << buckets;
    EXPECT_EQ(fused, buckets ? 2 : 1) << "buckets " << buckets;
    EXPECT_EQ(inputs, 8) << "buckets " << buckets;  // every (param, grad) pair in a fused node
  }
}

// Hand-built fused nodes over two real adam steps (the pass never builds these): a gradient of
// another shape or dtype than its parameter's is a qg::Error naming the op and the part.
TEST(MultiTensorAdamFusion, KernelRejectsBadInputs) {
  for (const TensorType& bad_grad : {TensorType{DType::f32, {5}}, TensorType{DType::f16, {4}}}) {
    Graph g;
    ValueId p0 = g.parameter("p0", Tensor::zeros({4}, DType::f32));
    ValueId p1 = g.parameter("p1", Tensor::zeros({4}, DType::f32));
    ValueId g0 = g.input("g0", {DType::f32, {4}});
    ValueId g1 = g.input("g1", bad_grad);
    ValueId ok1 = g.input("ok1", {DType::f32, {4}});
    g.apply("adam", {p0, g0}, {}, "p0.adam");
    const NodeId s0 = g.num_nodes() - 1;
    g.apply("adam", {p1, ok1}, {}, "p1.adam");
    const NodeId s1 = g.num_nodes() - 1;
    Node fused;
    fused.op = &OpRegistry::instance().get("fused_multi_tensor_adam");
    fused.name = "bad";
    fused.inputs = {p0, g0, p1, g1};
    for (NodeId s : {s0, s1}) {
      fused.fused_from.push_back(g.node(s));
      fused.states.insert(fused.states.end(), g.node(s).states.begin(), g.node(s).states.end());
    }
    const NodeId id = g.add_raw_node(fused, {});
    g.remove_node(s1);
    g.remove_node(s0);
    const Executor::Feeds in = {{"g0", Tensor::zeros({4}, DType::f32)},
                                {"g1", Tensor::zeros(bad_grad.shape, bad_grad.dtype)},
                                {"ok1", Tensor::zeros({4}, DType::f32)}};
    SCOPED_TRACE(bad_grad.str());
    testing::expect_error([&] { Executor(g).run(in, {}, {id}); },
                          {"fused_multi_tensor_adam", "part 1", "one shape"});
  }
}

// The bf16-mixed float Llama: its 22 adam steps become two nodes (the f32 gradients of the
// embedding and the norms, the bf16 ones of the GEMM weights), and training is bit for bit
// the same.
TEST(MultiTensorAdamFusion, MixedPrecisionLlamaTrainsBitForBitTheSame) {
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_multi_tensor_adam", Device::cpu()), 2);
}

TEST(MultiTensorAdamFusion, GpuMixedPrecisionLlamaTrainsBitForBitTheSame) {
  QG_REQUIRE_GPU();
  EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_multi_tensor_adam", Device::cuda()), 2);
}

}  // namespace
}  // namespace qg
