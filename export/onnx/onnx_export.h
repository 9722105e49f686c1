// ONNX export of a qatgraph forward graph as a QDQ model (opset 17, ONNX 1.12's IR 8), built
// with ONNX's own protobuf classes (onnx::ModelProto) and checked by ONNX's checker and strict
// shape inference before it is returned.
//
// The graph is exported as it runs in eval mode: frozen observers' qparams, batch norms on
// running statistics. Give it a model converted to integer weights (nn::convert_to_integer),
// so that weights are integer codes:
//   activation fake-quant   QuantizeLinear -> DequantizeLinear (scale and zero point of the
//                           frozen observer; a Clip between them for ranges narrower than
//                           uint8/int8, e.g. 4-bit activations)
//   int8 / int4 / int2      int8 initializers (exact codes; ONNX 1.12 has no 4-bit type) +
//   weights                 DequantizeLinear per tensor or per output channel (axis 0), or
//                           per group through a [out * groups, g] reshape (onnx_weights.cpp)
//   NF4 weights             dequantized f32 initializers, with a warning
//   per-token dynamic       decomposed into f32 ops, exactly (onnx_map_quant.cpp)
//   Linear / conv-bn        Gemm (transB = 1, bias C) / Conv with the folded bias
// The batch axis is dynamic ("batch"); everything else is fixed as built.
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

struct Options {
  std::string graph_name = "qatgraph";
  std::string doc;                                            // the model's doc_string
  std::vector<std::pair<std::string, std::string>> metadata;  // metadata_props
};

struct Result {
  std::string bytes;                  // the serialized ModelProto
  std::vector<std::string> warnings;  // what could not be exported exactly as integers
  std::map<std::string, int> op_counts;
  int nodes = 0, initializers = 0;
  int64_t initializer_bytes = 0;
};

// Exports what computes `output` from `input` (the graph's only input the output needs;
// leading axis = batch). Input and output keep their qatgraph names. The executor is
// switched to eval mode for the export and restored. Throws qg::Error (op "export.onnx") for
// an op without an ONNX mapping or a layout it cannot express; nothing is returned then.
Result export_graph(const Graph& graph, Executor& exec, ValueId input, ValueId output,
                    const Options& options = {});

}  // namespace qg::onnx_export
