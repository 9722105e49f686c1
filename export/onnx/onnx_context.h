// Internal to export/onnx: the state of one export. The exporter walks the qatgraph forward
// graph backwards from the output, on demand: asking for a value's ONNX name emits the nodes
// that compute it (its producer's mapper, export/onnx/onnx_map_*.cpp), so nodes the output
// does not need, and nodes a mapper folds away (a straight-through estimator's x - x), are
// never emitted.
//
// Mappers write the opset of the export (17, or 21 for INT4 weights); where an op's form
// changed between them (the reductions' axes), Context::reduce writes the right one.
//
// Values that do not depend on the graph input are "leaves": parameters, constants, frozen
// observers' qparams (eval mode) and whatever is computed from them only. A leaf becomes an
// initializer: integer weight codes plus a DequantizeLinear (onnx_weights.cpp), or its value
// as fetched from the executor in eval mode.
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/graph.h"
#include "runtime/executor.h"

namespace qg::onnx_export {

using AttrList = std::vector<onnx::AttributeProto>;
onnx::AttributeProto attr_int(const std::string& name, int64_t v);
onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& v);
onnx::AttributeProto attr_float(const std::string& name, float v);

class Context {
 public:
  // `exec` runs `graph` (eval mode); `input` is the one graph input the model takes,
  // `output` the value exported as the graph output.
  Context(const Graph& graph, Executor& exec, ValueId input, ValueId output, onnx::GraphProto& out,
          int64_t opset);

  // The ONNX tensor name of `v`, emitting what computes it on first use.
  std::string value(ValueId v);
  // Records that `v` is computed by ONNX tensor `name` (a mapper's result).
  void bind(ValueId v, const std::string& name);

  // A tensor name not used yet, derived from `base`.
  std::string fresh(const std::string& base);
  // Appends a node with the given output names; returns the first.
  std::string node(const std::string& op, const std::vector<std::string>& inputs,
                   const std::vector<std::string>& outputs, const AttrList& attrs = {});
  // Appends a node with one output, named fresh from `base`.
  std::string node1(const std::string& op, const std::vector<std::string>& inputs,
                    const std::string& base, const AttrList& attrs = {});

  // Initializers (names fresh from `base`). `t` is copied with its own dtype, reshaped to
  // `shape` when that is given.
  std::string initializer(const std::string& base, const Tensor& t, const Shape* shape = nullptr);
  std::string initializer_f32(const std::string& base, const Shape& shape,
                              const std::vector<float>& v);
  std::string initializer_i8(const std::string& base, const Shape& shape,
                             const std::vector<int8_t>& v);
  std::string initializer_u8(const std::string& base, const Shape& shape,
                             const std::vector<uint8_t>& v);
  std::string initializer_i64(const std::string& base, const std::vector<int64_t>& v);
  std::string scalar_f32(const std::string& base, float v);
  std::string scalar_f64(const std::string& base, double v);
  // 4-bit codes (-8..7) as an INT4 initializer (opset >= 21): two a byte, low nibble first.
  std::string initializer_i4(const std::string& base, const Shape& shape,
                             const std::vector<int8_t>& codes);

  // A reduction over `axes` (empty: all) keeping them: the axes are an attribute before opset
  // 18 (ReduceSum: 13) and an input since.
  std::string reduce(const std::string& op, const std::string& x, const std::vector<int64_t>& axes,
                     const std::string& base);
  // One initializer for every request with the same `key` (a description of its contents,
  // e.g. the rope tables of a position range, shared by every layer): `make` runs once.
  std::string shared(const std::string& key, const std::function<std::string()>& make);
  // Cast to ONNX element type `to` (onnx::TensorProto_DataType).
  std::string cast(const std::string& x, int to, const std::string& base);
  // x (an f32 tensor) rounded to `storage` and widened back: Cast to BFLOAT16 and back to
  // FLOAT, which rounds to nearest even as qatgraph's f32 -> bf16 does. x itself for f32.
  // A bf16 value of qatgraph is an f32 tensor of the export holding exactly its values
  // (every bf16 is an f32), so each rounding qatgraph does is one such pair here. Other
  // storage dtypes are a named error naming `what`.
  std::string round_to(const std::string& x, DType storage, const std::string& base,
                       const std::string& what);
  int64_t opset() const { return opset_; }

  const Graph& graph() const { return g_; }
  const Node& producer(ValueId v) const { return g_.node(g_.value(v).producer); }
  const Shape& shape(ValueId v) const { return g_.value(v).type.shape; }
  // True when v is computed from the graph input (so it is not an initializer).
  bool depends_on_input(ValueId v) const { return depends_[v]; }
  // The value of a leaf in eval mode (throws for values that depend on the input).
  const Tensor& leaf(ValueId v) const;
  // How many nodes the exported output needs read v.
  int uses(ValueId v) const;
  // A readable base name for v: its qatgraph name, else its producer's node name.
  std::string base_name(ValueId v) const;
  // A fresh ONNX name for the i-th output of n (mappers name their results with it): the
  // value's qatgraph name when it has one ("logits"), else `base`, else base_name().
  std::string output_name(const Node& n, size_t i = 0, const std::string& base = "");
  // The batch size the graph was built at (the input's leading axis), exported as dynamic.
  int64_t batch() const { return batch_; }

  void warn(const std::string& w) { warnings_.push_back(w); }
  const std::vector<std::string>& warnings() const { return warnings_; }
  int64_t initializer_bytes() const { return initializer_bytes_; }

 private:
  void emit_producer(ValueId v);
  void round_outputs(const Node& n);

  const Graph& g_;
  onnx::GraphProto& out_;
  ValueId input_;
  int64_t opset_;
  int64_t batch_ = 0;
  std::vector<bool> needed_, depends_;
  std::map<ValueId, Tensor> leaves_;
  std::map<ValueId, std::string> bound_;
  std::map<std::string, std::string> shared_;
  std::set<std::string> names_;
  std::set<NodeId> in_progress_;
  std::vector<std::string> warnings_;
  int64_t initializer_bytes_ = 0;
};

// Emits a leaf value: integer weights as codes + DequantizeLinear, anything else as an
// initializer holding its eval-mode value (onnx_weights.cpp).
std::string emit_leaf(Context& ctx, ValueId v);

// One mapper per qatgraph op kind: emits the ONNX nodes computing the node's outputs and
// binds them (Context::bind). Tables in onnx_map_tensor.cpp and onnx_map_quant.cpp.
using Mapper = void (*)(Context& ctx, const Node& node);
void add_tensor_mappers(std::map<std::string, Mapper>& table);
void add_quant_mappers(std::map<std::string, Mapper>& table);
// The Llama decoder's ops: rms_norm, rope, silu (onnx_map_decoder.cpp), causal_attention
// (onnx_map_attention.cpp).
void add_decoder_mappers(std::map<std::string, Mapper>& table);
void add_attention_mapper(std::map<std::string, Mapper>& table);
const Mapper* find_mapper(const std::string& op);

}  // namespace qg::onnx_export
