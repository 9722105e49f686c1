// The ONNX exporter (export/onnx/) on the digits models, in process: what each layer and
// quantizer becomes, that integer weights are stored as exact codes (weights rebuilt from
// the ONNX initializers equal the converted graph's, bit for bit), and the errors.
// onnxruntime's agreement is checked by the onnx_export_roundtrip ctest.
#include <gtest/gtest.h>

#ifdef QG_WITH_ONNX
#include <onnx/onnx_pb.h>

#include <cstring>

#include "export/onnx/onnx_export.h"
#include "nn/convert.h"
#include "tests/core/test_util.h"
#include "tests/train/train_util.h"

namespace qg {
namespace {

using testing::expect_error;

struct Exported {
  onnx::ModelProto model;
  onnx_export::Result result;
  nn::ModelInstance inst;  // the converted graph it came from
};

class OnnxExport : public ::testing::Test, public testing::DigitsFixture {
 protected:
  // A model of `kind` whose observers have seen a few batches, converted and exported.
  Exported export_model(const std::string& kind, const nn::QConfig& qc) {
    nn::TrainConfig c = config(qc, 16);
    c.model = kind;
    c.cnn.channels = {4, 8, 8};
    c.transformer.d_model = 16;
    c.transformer.heads = 2;
    c.transformer.mlp_hidden = 32;
    nn::Trainer t(c, train, test);
    t.calibrate(train, 3);
    Exported e;
    e.inst = nn::build_instance(c.spec(), 8, qc, Device::cpu());
    nn::copy_states(t.executor(), *e.inst.exec);
    nn::convert_to_integer(e.inst, qc);
    e.result =
        onnx_export::export_graph(*e.inst.graph, *e.inst.exec, e.inst.model.x, e.inst.model.logits);
    EXPECT_TRUE(e.model.ParseFromString(e.result.bytes));
    return e;
  }
};

const onnx::TensorProto* initializer(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& t : m.graph().initializer())
    if (t.name() == name) return &t;
  return nullptr;
}

std::vector<const onnx::NodeProto*> nodes(const onnx::ModelProto& m, const std::string& op) {
  std::vector<const onnx::NodeProto*> out;
  for (const auto& n : m.graph().node())
    if (n.op_type() == op) out.push_back(&n);
  return out;
}

int64_t attr(const onnx::NodeProto& n, const std::string& name, int64_t missing = -99) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return a.i();
  return missing;
}

std::vector<int64_t> dims(const onnx::TensorProto& t) {
  return std::vector<int64_t>(t.dims().begin(), t.dims().end());
}

template <typename T>
std::vector<T> values(const onnx::TensorProto& t) {
  std::vector<T> v(t.raw_data().size() / sizeof(T));
  std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  return v;
}

// The converted graph's dequantized weight of `layer`, as the layer reads it.
std::vector<float> converted_weight(nn::ModelInstance& inst, const std::string& layer) {
  const Graph& g = *inst.graph;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (!n.dead && n.name == layer + ".weight.int.dequantize") {
      Executor::Feeds feeds;
      for (ValueId in : g.inputs())
        feeds[g.value(in).name] = Tensor::zeros(g.value(in).type.shape, g.value(in).type.dtype);
      Tensor w = inst.exec->run(feeds, {n.outputs[0]})[0];
      return std::vector<float>(w.data<float>(), w.data<float>() + w.numel());
    }
  }
  ADD_FAILURE() << "no dequantize node for " << layer;
  return {};
}

TEST_F(OnnxExport, MlpW8A8IsQdqWithPerChannelInt8Weights) {
  Exported e = export_model("mlp", nn::QConfig::w8a8());
  const onnx::ModelProto& m = e.model;
  EXPECT_EQ(m.opset_import(0).version(), 17);
  ASSERT_EQ(m.graph().input_size(), 1);
  EXPECT_EQ(m.graph().input(0).name(), "x");
  EXPECT_EQ(m.graph().input(0).type().tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(m.graph().output(0).name(), "logits");
  // input, fc1.out, fc2.out: one QuantizeLinear each; 2 weights + 3 activations dequantized.
  EXPECT_EQ(nodes(m, "QuantizeLinear").size(), 3u);
  EXPECT_EQ(nodes(m, "DequantizeLinear").size(), 5u);
  ASSERT_EQ(nodes(m, "Gemm").size(), 2u);
  for (const auto* g : nodes(m, "Gemm")) {
    EXPECT_EQ(attr(*g, "transB"), 1);
    EXPECT_EQ(g->input_size(), 3);  // bias as C
  }
  const onnx::TensorProto* w = initializer(m, "fc1.weight_quantized");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->data_type(), onnx::TensorProto_DataType_INT8);
  EXPECT_EQ(dims(*w), (std::vector<int64_t>{16, 64}));
  const onnx::TensorProto* s = initializer(m, "fc1.weight_scale");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(dims(*s), (std::vector<int64_t>{16}));
  for (const auto* dq : nodes(m, "DequantizeLinear")) {
    if (dq->input(0) == "fc1.weight_quantized") {
      EXPECT_EQ(attr(*dq, "axis"), 0);
    }
  }
  // Weights exist only as int8 codes: no f32 initializer has a weight's size.
  for (const auto& t : m.graph().initializer()) {
    if (t.data_type() == onnx::TensorProto_DataType_FLOAT) {
      EXPECT_LT(t.raw_data().size(), 16u * 64);
    }
  }
  // code * scale is the converted graph's weight, bit for bit.
  std::vector<int8_t> codes = values<int8_t>(*w);
  std::vector<float> scale = values<float>(*s), ref = converted_weight(e.inst, "fc1");
  ASSERT_EQ(ref.size(), codes.size());
  for (size_t i = 0; i < codes.size(); ++i)
    ASSERT_EQ(static_cast<float>(codes[i]) * scale[i / 64], ref[i]) << i;
  EXPECT_TRUE(e.result.warnings.empty());
}

TEST_F(OnnxExport, Int4AndInt2CodesAreExactInt8Values) {
  for (auto [qc, lo, hi] : {std::tuple{nn::QConfig::w4a8(), -8, 7}, {nn::QConfig::w2a8(), -2, 1}}) {
    Exported e = export_model("mlp", qc);
    const onnx::TensorProto* w = initializer(e.model, "fc1.weight_quantized");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->data_type(), onnx::TensorProto_DataType_INT8);
    std::vector<int8_t> codes = values<int8_t>(*w);
    std::vector<float> scale = values<float>(*initializer(e.model, "fc1.weight_scale"));
    std::vector<float> ref = converted_weight(e.inst, "fc1");
    int low = 0, high = 0;
    for (size_t i = 0; i < codes.size(); ++i) {
      ASSERT_GE(codes[i], lo);
      ASSERT_LE(codes[i], hi);
      low = std::min<int>(low, codes[i]);
      high = std::max<int>(high, codes[i]);
      ASSERT_EQ(static_cast<float>(codes[i]) * scale[i / 64], ref[i]) << qc.str() << " " << i;
    }
    EXPECT_EQ(high, hi) << qc.str();  // the range is used (int4 is not stored as int8 codes)
  }
}

TEST_F(OnnxExport, GroupWiseWeightsWithATailGroupArePaddedAndSliced) {
  Exported e = export_model("mlp", nn::QConfig::w4a8_group(24));  // 64 = 24 + 24 + 16
  const onnx::TensorProto* w = initializer(e.model, "fc1.weight_quantized");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(dims(*w), (std::vector<int64_t>{16 * 3, 24}));
  EXPECT_EQ(dims(*initializer(e.model, "fc1.weight_scale")), (std::vector<int64_t>{48}));
  // fc2's 16 inputs fit one group: one scale per row, per channel, nothing to slice.
  EXPECT_EQ(nodes(e.model, "Slice").size(), 1u);
  EXPECT_EQ(dims(*initializer(e.model, "fc2.weight_quantized")), (std::vector<int64_t>{10, 16}));
  // Rebuild fc1's weight from groups: row o, input k reads group o * 3 + k / 24.
  std::vector<int8_t> codes = values<int8_t>(*w);
  std::vector<float> scale = values<float>(*initializer(e.model, "fc1.weight_scale"));
  std::vector<float> ref = converted_weight(e.inst, "fc1");
  for (int64_t o = 0; o < 16; ++o)
    for (int64_t k = 0; k < 64; ++k) {
      const int64_t grp = o * 3 + k / 24;
      ASSERT_EQ(static_cast<float>(codes[grp * 24 + k % 24]) * scale[grp], ref[o * 64 + k]);
    }
}

TEST_F(OnnxExport, CnnFoldsBatchNormIntoConvBias) {
  Exported e = export_model("cnn", nn::QConfig::w8a8());
  auto convs = nodes(e.model, "Conv");
  ASSERT_EQ(convs.size(), 3u);
  for (const auto* c : convs) {
    EXPECT_EQ(c->input_size(), 3);
    EXPECT_EQ(attr(*c, "group"), 1);
  }
  EXPECT_TRUE(nodes(e.model, "BatchNormalization").empty());
  EXPECT_EQ(nodes(e.model, "MaxPool").size(), 1u);
  EXPECT_EQ(nodes(e.model, "GlobalAveragePool").size(), 1u);
  const onnx::TensorProto* w = initializer(e.model, "conv2.weight_quantized");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(dims(*w), (std::vector<int64_t>{8, 4, 3, 3}));  // stored in the kernel's shape
  // Float weights: nothing folded, the batch norm runs on its running statistics.
  Exported f = export_model("cnn", nn::QConfig::float32());
  EXPECT_EQ(nodes(f.model, "BatchNormalization").size(), 3u);
  EXPECT_TRUE(nodes(f.model, "QuantizeLinear").empty());
}

TEST_F(OnnxExport, TransformerWithDynamicPerTokenActivations) {
  Exported e = export_model("transformer", nn::QConfig::int8_dyn_act_int4_weight(8));
  const auto& m = e.model;
  EXPECT_EQ(nodes(m, "LayerNormalization").size(), 3u);  // ln1, ln2, ln_f
  EXPECT_EQ(nodes(m, "Softmax").size(), 1u);
  EXPECT_EQ(nodes(m, "Erf").size(), 1u);
  EXPECT_EQ(nodes(m, "ReduceMean").size(), 1u);  // mean over tokens
  // One per-token dynamic quantizer per GEMM input value (embed, q/k/v sharing one,
  // nn/gemm_operand.cpp, out, fc1, fc2, head): spelled out (ReduceMin/ReduceMax over the last
  // axis), no static QDQ on activations.
  EXPECT_EQ(nodes(m, "ReduceMin").size(), 6u);
  for (const auto* r : nodes(m, "ReduceMin")) EXPECT_EQ(attr(*r, "keepdims"), 1);
  EXPECT_TRUE(nodes(m, "QuantizeLinear").empty());
  EXPECT_EQ(nodes(m, "DequantizeLinear").size(), 8u);  // the eight int4 weights
  // The straight-through estimators are folded away: no x - x.
  for (const auto* s : nodes(m, "Sub")) EXPECT_NE(s->input(0), s->input(1));
}

TEST_F(OnnxExport, Nf4WeightsAreFloatWithAWarning) {
  Exported e = export_model("mlp", nn::QConfig::nf4a8());
  ASSERT_EQ(e.result.warnings.size(), 2u);
  EXPECT_NE(e.result.warnings[0].find("NF4"), std::string::npos);
  EXPECT_EQ(initializer(e.model, "fc1.weight_quantized"), nullptr);
  EXPECT_EQ(nodes(e.model, "QuantizeLinear").size(), 3u);  // activations stay QDQ
}

TEST(OnnxExportErrors, AnOpWithoutAMappingIsAnError) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 4}});
  ValueId y = g.apply1("sqrt", {x});
  g.set_name(y, "y");
  Executor ex(g);
  expect_error([&] { onnx_export::export_graph(g, ex, x, y); },
               {"export.onnx", "op 'sqrt'", "no ONNX mapping"});
}

TEST(OnnxExportErrors, TheOutputMustDependOnTheInput) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 4}});
  ValueId c = g.constant(Tensor::zeros({2, 4}, DType::f32), "c");
  ValueId y = g.apply1("relu", {c});
  Executor ex(g);
  expect_error([&] { onnx_export::export_graph(g, ex, x, y); },
               {"export.onnx", "does not depend on the graph input"});
}

TEST(OnnxExportErrors, AReshapeThatMovesTheBatchIsAnError) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {6, 4}});
  ValueId y = g.apply1("reshape", {x}, {{"shape", Shape{4, 6}}}, "fold");
  Executor ex(g);
  expect_error([&] { onnx_export::export_graph(g, ex, x, y); },
               {"reshape 'fold'", "does not keep the batch (6)"});
}

// Casts are exported for bf16 mixed precision only: f32 <-> bf16.
TEST(OnnxExportErrors, ACastToF16IsAnError) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 4}});
  ValueId h = g.apply1("cast", {x}, {{"dtype", std::string("f16")}}, "to_f16");
  ValueId y = g.apply1("cast", {h}, {{"dtype", std::string("f32")}}, "back");
  Executor ex(g);
  expect_error([&] { onnx_export::export_graph(g, ex, x, y); },
               {"export.onnx", "cast 'to_f16' from f32 to f16 is not exported"});
}

// An op outside the checked bf16 list with a bf16 output is refused, not exported in f32.
TEST(OnnxExportErrors, ABf16OpWithoutACheckedBf16FormIsAnError) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 4}});
  ValueId h = g.apply1("cast", {x}, {{"dtype", std::string("bf16")}}, "to_bf16");
  ValueId s = g.apply1("softmax", {h}, {{"axis", int64_t{-1}}}, "probs");
  ValueId y = g.apply1("cast", {s}, {{"dtype", std::string("f32")}}, "back");
  Executor ex(g);
  expect_error([&] { onnx_export::export_graph(g, ex, x, y); },
               {"export.onnx", "softmax 'probs' has a bf16 output", "exported in f32 only"});
}

}  // namespace
}  // namespace qg

#else
TEST(OnnxExport, SkippedWithoutOnnx) {
  GTEST_SKIP() << "built without libonnx-dev";
}
#endif
