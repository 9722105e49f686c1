// ONNX export of a qatgraph forward graph as a QDQ model, built with ONNX's own protobuf
// classes (onnx::ModelProto of Debian's ONNX 1.12):
//   opset 17 (IR 8, the default)  what ONNX 1.12 knows: checked by its checker and strict
//                                 shape inference before it is returned;
//   opset 21 (IR 10, kInt4Opset)  for 4-bit weights stored as 4 bits: INT4 initializers
//                                 (TensorProto data_type 22, two codes a byte, low nibble
//                                 first) and DequantizeLinear with block_size. ONNX 1.12's
//                                 classes write them (data_type and the attributes are plain
//                                 fields), but its checker and shape inference stop at opset
//                                 17, so these models are checked by the PyPI onnx checker
//                                 (scripts/onnx_llm_check.py) instead.
//
// The graph is exported as it runs in eval mode: frozen observers' qparams, batch norms on
// running statistics. Give it a model converted to integer weights (nn::convert_to_integer),
// so that weights are integer codes:
//   activation fake-quant   QuantizeLinear -> DequantizeLinear (scale and zero point of the
//                           frozen observer; a Clip between them for ranges narrower than
//                           uint8/int8, e.g. 4-bit activations)
//   int8 / int4 / int2      int8 initializers (exact codes; opset 17 has no 4-bit type) +
//   weights                 DequantizeLinear per tensor or per output channel (axis 0), or
//                           per group through a [out * groups, g] reshape (onnx_weights.cpp);
//                           at opset 21, packed INT4 codes (int4, int3 and int2 recipes) with
//                           DequantizeLinear(axis 1, block_size = group)
//   NF4 weights             dequantized f32 initializers, with a warning
//   per-token dynamic       decomposed into f32 ops, exactly (onnx_map_quant.cpp)
//   Linear / conv-bn        Gemm (transB = 1, bias C) / Conv with the folded bias
//   Llama decoder ops        rms_norm, rope, causal_attention (GQA), silu: spelled out in
//                           ONNX ops (onnx_map_decoder.cpp, onnx_map_attention.cpp)
// The batch axis is dynamic ("batch"); everything else is fixed as built. The input is f32
// (features) or i64 (token ids); the output is f32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/graph.h"
#include "runtime/executor.h"

namespace qg::onnx_export {

constexpr int64_t kOpset = 17;
// The first opset with INT4 tensors and blocked DequantizeLinear.
constexpr int64_t kInt4Opset = 21;

struct Options {
  std::string graph_name = "qatgraph";
  std::string doc;                                            // the model's doc_string
  std::vector<std::pair<std::string, std::string>> metadata;  // metadata_props
  int64_t opset = kOpset;                                     // kOpset or kInt4Opset
};

struct Result {
  std::string bytes;                  // the serialized ModelProto
  std::vector<std::string> warnings;  // what could not be exported exactly as integers
  std::map<std::string, int> op_counts;
  int nodes = 0, initializers = 0;
  int64_t initializer_bytes = 0;
  bool checked = false;  // by ONNX 1.12's checker and shape inference (opset 17 only)
};

// Exports what computes `output` from `input` (the graph's only input the output needs;
// leading axis = batch). Input and output keep their qatgraph names. The executor is
// switched to eval mode for the export and restored. Throws qg::Error (op "export.onnx") for
// an op without an ONNX mapping or a layout it cannot express; nothing is returned then.
Result export_graph(const Graph& graph, Executor& exec, ValueId input, ValueId output,
                    const Options& options = {});

}  // namespace qg::onnx_export
