// The ONNX exporter on the Llama decoder, in process: at opset 21 the 4-bit weights are INT4
// initializers (two codes a byte, low nibble first) whose codes times their block's scale
// are the converted graph's weights bit for bit, int8 weights stay int8; at opset 17 the same
// decoder passes ONNX 1.12's checker and strict shape inference (so the decoder mappers write
// well-formed nodes); the rope tables and the causal mask are written once for all layers;
// and what the decoder mappers do not support is a named error. onnxruntime's agreement (the
// greedy decode) is checked by the onnx_llm_roundtrip ctest.
#include <gtest/gtest.h>

#ifdef QG_WITH_ONNX
#include <onnx/onnx_pb.h>

#include <cstring>

#include "export/onnx/onnx_export.h"
#include "nn/convert.h"
#include "nn/llama_config.h"
#include "nn/qconfig.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

nn::LlamaConfig tiny_config() {
  return nn::parse_llama_config(
      R"({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 40,
          "max_position_embeddings": 16, "tie_word_embeddings": false})",
      "tiny");
}

struct Exported {
  nn::LlamaInstance inst;
  onnx_export::Result result;
  onnx::ModelProto model;
};

// A randomly initialised tiny decoder (batch 2, seq 6) converted under `qc` and exported.
Exported export_llama(const nn::QConfig& qc, int64_t opset,
                      const nn::PrecisionPolicy& precision = nn::PrecisionPolicy::f32()) {
  Exported e;
  e.inst = nn::build_llama_instance(tiny_config(), 2, 6, qc, Device::cpu(), precision);
  nn::convert_to_integer(e.inst, qc);
  onnx_export::Options o;
  o.opset = opset;
  e.result = onnx_export::export_graph(*e.inst.graph, *e.inst.exec, e.inst.model.input_ids,
                                       e.inst.model.logits, o);
  EXPECT_TRUE(e.model.ParseFromString(e.result.bytes));
  return e;
}

const onnx::TensorProto* initializer(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& t : m.graph().initializer())
    if (t.name() == name) return &t;
  return nullptr;
}

int count(const onnx::ModelProto& m, const std::string& op) {
  int n = 0;
  for (const auto& node : m.graph().node()) n += node.op_type() == op;
  return n;
}

std::vector<float> floats(const onnx::TensorProto& t) {
  std::vector<float> v(t.raw_data().size() / 4);
  std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  return v;
}

// The converted graph's weight that a dequantize node computes, in eval mode.
Tensor converted_weight(Exported& e, const Node& n) {
  Executor::Feeds feeds = {{"input_ids", Tensor::zeros({2, 6}, DType::i64)},
                           {"labels", Tensor::zeros({2, 5}, DType::i64)}};
  e.inst.exec->set_training(false);
  return e.inst.exec->run(feeds, {n.outputs[0]})[0].to(Device::cpu());
}

std::string weight_name(const Node& n) {
  const std::string suffix = ".int.dequantize";
  EXPECT_GT(n.name.size(), suffix.size()) << n.name;
  return n.name.substr(0, n.name.size() - suffix.size());
}

TEST(OnnxExportLlama, Int4WeightsAreInt4InitializersWhoseBlocksGiveTheConvertedWeights) {
  for (const std::string recipe : {"8da4w", "8da2w"}) {
    SCOPED_TRACE(recipe);
    Exported e = export_llama(nn::parse_recipe(recipe, 32), onnx_export::kInt4Opset);
    EXPECT_EQ(e.model.opset_import(0).version(), 21);
    EXPECT_EQ(e.model.ir_version(), 10);
    EXPECT_FALSE(e.result.checked);  // past ONNX 1.12: the PyPI checker checks it
    const auto& in = e.model.graph().input(0);
    EXPECT_EQ(in.name(), "input_ids");
    EXPECT_EQ(in.type().tensor_type().elem_type(), onnx::TensorProto_DataType_INT64);
    EXPECT_EQ(in.type().tensor_type().shape().dim(0).dim_param(), "batch");
    EXPECT_EQ(in.type().tensor_type().shape().dim(1).dim_value(), 6);
    int weights = 0;
    const Graph& g = *e.inst.graph;
    std::vector<bool> needed = g.needed_nodes({e.inst.model.logits});
    for (NodeId id = 0; id < static_cast<NodeId>(g.num_nodes()); ++id) {
      const Node& n = g.node(id);
      if (!needed[id] || n.dead || n.op->name != "int4_unpack_dequantize") continue;
      ++weights;
      const std::string w = weight_name(n);
      const onnx::TensorProto* codes = initializer(e.model, w + "_quantized");
      const onnx::TensorProto* scales = initializer(e.model, w + "_scale");
      ASSERT_TRUE(codes != nullptr && scales != nullptr) << w;
      EXPECT_EQ(codes->data_type(), 22) << w;  // INT4
      const Tensor ref = converted_weight(e, n);
      ASSERT_EQ(codes->dims_size(), 2);
      const int64_t out = codes->dims(0), cols = codes->dims(1);
      ASSERT_EQ(ref.numel(), out * cols) << w;
      EXPECT_EQ(static_cast<int64_t>(codes->raw_data().size()), (out * cols + 1) / 2) << w;
      const std::vector<float> s = floats(*scales);
      const int64_t groups = scales->dims(1);
      EXPECT_EQ(groups, (cols + 31) / 32) << w;
      const float* r = ref.data<float>();
      int mismatches = 0;
      for (int64_t i = 0; i < out * cols; ++i) {
        const auto byte = static_cast<uint8_t>(codes->raw_data()[static_cast<size_t>(i / 2)]);
        int code = i % 2 == 0 ? byte & 0xf : byte >> 4;
        if (code >= 8) code -= 16;
        const float v = static_cast<float>(code) *
                        s[static_cast<size_t>((i / cols) * groups + (i % cols) / 32)];
        mismatches += std::memcmp(&v, &r[i], sizeof v) != 0;
      }
      EXPECT_EQ(mismatches, 0) << w;
    }
    EXPECT_EQ(weights, 2 * 7 + 1);  // seven projections a layer and the lm_head
    EXPECT_EQ(count(e.model, "DequantizeLinear"), weights);
    for (const auto& node : e.model.graph().node())
      if (node.op_type() == "DequantizeLinear") {
        ASSERT_EQ(node.attribute_size(), 2) << node.name();
        EXPECT_EQ(node.attribute(0).name(), "axis");
        EXPECT_EQ(node.attribute(0).i(), 1);
        EXPECT_EQ(node.attribute(1).name(), "block_size");
        EXPECT_EQ(node.attribute(1).i(), 32);
      }
  }
}

TEST(OnnxExportLlama, W8a8WeightsStayInt8PerChannel) {
  Exported e = export_llama(nn::parse_recipe("w8a8_dynamic", 32), onnx_export::kInt4Opset);
  int int8 = 0;
  for (const auto& t : e.model.graph().initializer()) {
    EXPECT_NE(t.data_type(), 22) << t.name();
    int8 += t.data_type() == onnx::TensorProto_DataType_INT8;
  }
  EXPECT_EQ(int8, 2 * (2 * 7 + 1));  // codes and zero points of every weight
}

TEST(OnnxExportLlama, AtOpset17TheDecoderPassesOnnx112sCheckerAndShapeInference) {
  for (const std::string recipe : {"8da4w", "float"}) {
    SCOPED_TRACE(recipe);
    Exported e = export_llama(nn::parse_recipe(recipe, 32), onnx_export::kOpset);
    EXPECT_TRUE(e.result.checked);
    EXPECT_EQ(e.model.opset_import(0).version(), 17);
    for (const auto& t : e.model.graph().initializer()) EXPECT_NE(t.data_type(), 22) << t.name();
    // One causal mask and one pair of rope tables for both layers' q and k.
    for (const std::string op : {"causal_mask", "rope.cos", "rope.sin"}) {
      EXPECT_NE(initializer(e.model, op), nullptr) << op;
      EXPECT_EQ(initializer(e.model, op + "_2"), nullptr) << op;
    }
    EXPECT_EQ(count(e.model, "Expand"), 4);  // k and v of both layers: 4 heads read 2
  }
}

// bf16 mixed precision: every bf16 value is an f32 tensor holding it exactly, and each of
// qatgraph's roundings to bf16 is a Cast to BFLOAT16 and back (onnxruntime's agreement, token
// for token, is the onnx_llm_roundtrip ctest). Integer weights stay codes; a float weight is
// stored as the bf16 values the model computes with.
int casts_to(const onnx::ModelProto& m, int type) {
  int n = 0;
  for (const auto& node : m.graph().node())
    if (node.op_type() == "Cast" && node.attribute(0).i() == type) ++n;
  return n;
}

TEST(OnnxExportLlama, Bf16MixedRoundsWhereQatgraphRoundsAndKeepsInt4Codes) {
  const auto bf16 = onnx::TensorProto_DataType_BFLOAT16;
  const auto f32 = onnx::TensorProto_DataType_FLOAT;
  Exported e = export_llama(nn::parse_recipe("8da4w", 32), onnx_export::kInt4Opset,
                            nn::parse_precision("bf16-mixed"));
  int int4 = 0;
  for (const auto& t : e.model.graph().initializer()) {
    int4 += t.data_type() == 22;
    EXPECT_NE(t.data_type(), bf16) << t.name();  // integer weights need no bf16 copy
  }
  EXPECT_EQ(int4, 2 * 7 + 1);
  // Per layer: 7 weight copies, 7 GEMM outputs, 2 x 3 rope roundings, attention, silu, the
  // gate product, 2 bf16 activation quantizers (o_proj, down_proj: 6 qparam steps with the
  // eps floor, and the output each), 5 f32 -> bf16 activation casts; then the lm_head's
  // weight, GEMM and input.
  const int per_layer = 7 + 7 + 6 + 1 + 1 + 1 + 2 * 7 + 5;
  EXPECT_EQ(casts_to(e.model, bf16), 2 * per_layer + 3);
  // Each widened right back; the 5 rms_norms' f64 means are the other casts to f32.
  EXPECT_EQ(casts_to(e.model, f32), casts_to(e.model, bf16) + 5);
  const auto& out = e.model.graph().output(0);
  EXPECT_EQ(out.type().tensor_type().elem_type(), f32);  // bf16 logits, held exactly
}

TEST(OnnxExportLlama, Bf16MixedFloatWeightsAreStoredAsTheirBf16Values) {
  Exported e = export_llama(nn::QConfig::float32(), onnx_export::kInt4Opset,
                            nn::parse_precision("bf16-mixed"));
  int bf16 = 0;
  for (const auto& t : e.model.graph().initializer())
    if (t.data_type() == onnx::TensorProto_DataType_BFLOAT16) {
      ++bf16;
      EXPECT_EQ(t.raw_data().size(), 2u * static_cast<size_t>(t.dims(0) * t.dims(1))) << t.name();
    }
  EXPECT_EQ(bf16, 2 * 7 + 1);  // every GEMM weight; the embedding table stays f32
}

TEST(OnnxExportLlama, Bf16MixedAtOpset17PassesOnnx112sChecker) {
  Exported e = export_llama(nn::parse_recipe("8da4w", 32), onnx_export::kOpset,
                            nn::parse_precision("bf16-mixed"));
  EXPECT_TRUE(e.result.checked);
}

TEST(OnnxExportLlama, F16MixedModelsAreANamedError) {
  expect_error(
      [] {
        export_llama(nn::parse_recipe("8da4w", 32), onnx_export::kInt4Opset,
                     nn::parse_precision("f16-mixed"));
      },
      {"export.onnx", "the output f32 or bf16", "f16[2, 6, 40]"});
}

TEST(OnnxExportLlama, AnotherOpsetIsANamedError) {
  expect_error([] { export_llama(nn::QConfig::float32(), 19); },
               {"export.onnx", "opset 19 is not one of 17, 21"});
}

}  // namespace
}  // namespace qg

#else
TEST(OnnxExportLlama, SkippedWithoutOnnx) {
  GTEST_SKIP() << "built without libonnx-dev";
}
#endif
