#include "export/onnx/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "core/error.h"
#include "export/onnx/onnx_context.h"

namespace qg::onnx_export {
namespace {

constexpr const char* kOp = "export.onnx";

// Restores the executor's mode however the export ends.
class EvalMode {
 public:
  explicit EvalMode(Executor& e) : e_(e), was_(e.training()) { e_.set_training(false); }
  ~EvalMode() { e_.set_training(was_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  Executor& e_;
  bool was_;
};

// ONNX's IR version of the opsets written here (IR 10 brought INT4).
int64_t ir_version(int64_t opset) {
  return opset >= kInt4Opset ? 10 : onnx::IR_VERSION;
}

void set_type(onnx::ValueInfoProto* v, const std::string& name, const TensorType& type) {
  const Shape& shape = type.shape;
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(type.dtype == DType::i64 ? onnx::TensorProto_DataType_INT64
                                            : onnx::TensorProto_DataType_FLOAT);
  auto* s = t->mutable_shape();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i == 0)
      s->add_dim()->set_dim_param("batch");
    else
      s->add_dim()->set_dim_value(shape[i]);
  }
}

// ONNX's checker, then strict shape inference (types of every node, on a copy): a model
// that fails either is a bug of the exporter, reported instead of written.
void check(const onnx::ModelProto& model) {
  try {
    onnx::checker::check_model(model);
    onnx::ModelProto copy = model;
    onnx::ShapeInferenceOptions strict(/*check_type=*/true, /*error_mode=*/1);
    onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(), strict);
  } catch (const std::exception& e) {
    QG_FAIL(kOp, "ONNX rejects the exported model: ", e.what());
  }
}

}  // namespace

Result export_graph(const Graph& graph, Executor& exec, ValueId input, ValueId output,
                    const Options& options) {
  const Value& in = graph.value(input);
  const Value& out = graph.value(output);
  QG_CHECK(graph.node(in.producer).op->name == "input", kOp, "value '", in.name,
           "' is not a graph input");
  // A bf16 output (a bf16-mixed model's logits) is written as the f32 tensor holding its
  // values exactly, as every bf16 value of the export is (Context::round_to).
  QG_CHECK((in.type.dtype == DType::f32 || in.type.dtype == DType::i64) &&
               (out.type.dtype == DType::f32 || out.type.dtype == DType::bf16),
           kOp, "the input must be f32 or i64 (token ids) and the output f32 or bf16, got ",
           in.type.str(), " and ", out.type.str());
  QG_CHECK(options.opset == kOpset || options.opset == kInt4Opset, kOp, "opset ", options.opset,
           " is not one of ", kOpset, ", ", kInt4Opset);
  EvalMode eval(exec);

  onnx::ModelProto model;
  model.set_ir_version(ir_version(options.opset));
  model.set_producer_name("qatgraph");
  model.set_doc_string(options.doc);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(options.opset);
  for (const auto& [k, v] : options.metadata) {
    auto* p = model.add_metadata_props();
    p->set_key(k);
    p->set_value(v);
  }
  onnx::GraphProto& g = *model.mutable_graph();
  g.set_name(options.graph_name);

  // 1. Walk from the output (nodes are emitted in dependency order by construction).
  Context ctx(graph, exec, input, output, g, options.opset);
  set_type(g.add_input(), in.name, in.type);
  ctx.bind(input, in.name);
  std::string y = ctx.value(output);
  const std::string out_name = out.name.empty() ? "output" : out.name;
  if (y != out_name) y = ctx.node("Identity", {y}, {out_name});  // e.g. an output bound to an alias
  set_type(g.add_output(), out_name, out.type);

  // 2. Check (what ONNX 1.12 knows), then serialize.
  Result r;
  r.checked = options.opset == kOpset;
  if (r.checked) check(model);
  QG_CHECK(model.SerializeToString(&r.bytes), kOp, "serializing the ONNX model failed");
  r.warnings = ctx.warnings();
  for (const auto& n : g.node()) ++r.op_counts[n.op_type()];
  r.nodes = g.node_size();
  r.initializers = g.initializer_size();
  r.initializer_bytes = ctx.initializer_bytes();
  return r;
}

}  // namespace qg::onnx_export
