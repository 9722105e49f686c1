// The fuse_norm_backward_add pass (ops/fused/norm_backward_add/, kernels in
// ops/rms_norm/rms_norm_cuda.cu): rms_norm_backward whose dx is accumulated onto a residual
// gradient, and the bf16 cast of that sum, become one node. The bf16-mixed Llama (float and
// 8da4w QAT) trains bit for bit the same with and without the pass, on the CPU and the GPU;
// the pass stands back where it must; the fused kernel rejects bad inputs with a qg::Error.
#include <gtest/gtest.h>

#include "nn/llama.h"
#include "nn/qconfig.h"
#include "ops/fused/norm_backward_add/norm_backward_add.h"
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

// rms_norm_backward of a [6, 40] x; its dx added to `residual` (as the second operand unless
// `dx_first`); `extra` adds what may block the fusion. Returns the rms_norm_backward's id.
NodeId build(Graph& g, bool dx_first, const std::function<void(Graph&, ValueId)>& extra = nullptr) {
  ValueId dy = g.input("dy", {DType::f32, {6, 40}});
  ValueId x = g.input("x", {DType::f32, {6, 40}});
  ValueId w = g.input("w", {DType::f32, {40}});
  ValueId rstd = g.input("rstd", {DType::f32, {6}});
  ValueId res = g.input("residual", {DType::f32, {6, 40}});
  std::vector<ValueId> out = g.apply("rms_norm_backward", {dy, x, w, rstd});
  if (extra) extra(g, out[0]);
  ValueId y = g.apply1(
      "add", dx_first ? std::vector<ValueId>{out[0], res} : std::vector<ValueId>{res, out[0]});
  g.mark_output(y);
  g.mark_output(out[1]);
  return g.value(out[0]).producer;
}

TEST(NormBackwardAddFusion, StandsBackWhereItMust) {
  {
    Graph g;
    EXPECT_EQ(norm_backward_add_fusion_blocker(g, build(g, false)), "");
  }
  {
    Graph g;
    EXPECT_EQ(norm_backward_add_fusion_blocker(g, build(g, true)),
              "the add does not read dx as its second operand only");
  }
  {
    Graph g;
    EXPECT_EQ(norm_backward_add_fusion_blocker(
                  g, build(g, false, [](Graph& gg, ValueId dx) { gg.mark_output(dx); })),
              "dx is a graph output or named (a run may fetch it)");
  }
  {
    Graph g;
    EXPECT_EQ(norm_backward_add_fusion_blocker(
                  g, build(g, false,
                           [](Graph& gg, ValueId dx) { gg.mark_output(gg.apply1("relu", {dx})); })),
              "dx has another reader");
  }
}

TEST(NormBackwardAddFusion, FusedNodesCannotBeAppliedDirectly) {
  Graph g;
  ValueId a = g.input("a", {DType::f32, {8}});
  testing::expect_error(
      [&] {
        g.apply("fused_rms_norm_backward_add", {a, a, a, a, a});
      },
      {"fused_rms_norm_backward_add", "fuse_norm_backward_add pass"});
}

// Hand-built fused nodes: a residual of another shape, or fused_from without the parts, is a
// qg::Error naming the op.
TEST(NormBackwardAddFusion, KernelRejectsBadInputs) {
  auto part = [](const char* op) {
    Node n;
    n.op = &OpRegistry::instance().get(op);
    return n;
  };
  for (int bad = 0; bad < 2; ++bad) {
    Graph g;
    Node fused;
    fused.op = &OpRegistry::instance().get("fused_rms_norm_backward_add");
    fused.name = "bad";
    const Shape res_shape = bad == 0 ? Shape{6, 39} : Shape{6, 40};
    fused.inputs = {g.input("dy", {DType::f32, {6, 40}}), g.input("x", {DType::f32, {6, 40}}),
                    g.input("w", {DType::f32, {40}}), g.input("rstd", {DType::f32, {6}}),
                    g.input("residual", {DType::f32, res_shape})};
    Node norm = part("rms_norm_backward");
    norm.inputs = {fused.inputs[0], fused.inputs[1], fused.inputs[2], fused.inputs[3]};
    Node add = part("add");
    add.inputs = {fused.inputs[4], fused.inputs[0]};
    fused.fused_from = bad == 0 ? std::vector<Node>{norm, add} : std::vector<Node>{add, norm};
    const NodeId id = g.add_raw_node(fused, {{DType::f32, {6, 40}}, {DType::f32, {40}}});
    Executor::Feeds in = {{"dy", Tensor::zeros({6, 40}, DType::f32)},
                          {"x", Tensor::zeros({6, 40}, DType::f32)},
                          {"w", Tensor::zeros({40}, DType::f32)},
                          {"rstd", Tensor::zeros({6}, DType::f32)},
                          {"residual", Tensor::zeros(res_shape, DType::f32)}};
    testing::expect_error(
        [&] { Executor(g).run(in, {g.node(id).outputs[0]}); },
        {"fused_rms_norm_backward_add", bad == 0 ? "residual" : "fused_from must be"});
  }
}

// The bf16-mixed Llama, float and 8da4w QAT: each layer's two norms' dx join the residual
// gradient (with its bf16 cast where one follows), and training is bit for bit the same.
void expect_llama_unchanged(Device device) {
  for (const char* recipe : {"float", "8da4w"})
    EXPECT_EQ(testing::expect_pass_keeps_llama_training("fuse_norm_backward_add", device, recipe),
              4)
        << recipe;
}

TEST(NormBackwardAddFusion, MixedPrecisionLlamaTrainsBitForBitTheSame) {
  expect_llama_unchanged(Device::cpu());
}

TEST(NormBackwardAddFusion, GpuMixedPrecisionLlamaTrainsBitForBitTheSame) {
  QG_REQUIRE_GPU();
  expect_llama_unchanged(Device::cuda());
}

}  // namespace
}  // namespace qg
