#include "export/onnx/onnx_context.h"

#include <cstring>

#include "core/error.h"

namespace qg::onnx_export {
namespace {

constexpr const char* kOp = "export.onnx";

bool is_observer(const Node& n) {
  const std::string& op = n.op->name;
  const std::string suffix = "_observer";
  return op.size() > suffix.size() &&
         op.compare(op.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int onnx_type(DType t) {
  switch (t) {
    case DType::f32:
      return onnx::TensorProto_DataType_FLOAT;
    case DType::f64:
      return onnx::TensorProto_DataType_DOUBLE;
    case DType::bf16:  // raw data: the 16 bits of each value, little-endian, as qatgraph's
      return onnx::TensorProto_DataType_BFLOAT16;
    case DType::i8:
      return onnx::TensorProto_DataType_INT8;
    case DType::u8:
      return onnx::TensorProto_DataType_UINT8;
    case DType::i32:
      return onnx::TensorProto_DataType_INT32;
    case DType::i64:
      return onnx::TensorProto_DataType_INT64;
    case DType::boolean:
      return onnx::TensorProto_DataType_BOOL;
    default:
      QG_FAIL(kOp, "a constant of dtype ", dtype_name(t), " has no ONNX counterpart here");
  }
}

}  // namespace

onnx::AttributeProto attr_int(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto_AttributeType_INT);
  a.set_i(v);
  return a;
}

onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto_AttributeType_INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}

onnx::AttributeProto attr_float(const std::string& name, float v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto_AttributeType_FLOAT);
  a.set_f(v);
  return a;
}

Context::Context(const Graph& graph, Executor& exec, ValueId input, ValueId output,
                 onnx::GraphProto& out, int64_t opset)
    : g_(graph), out_(out), input_(input), opset_(opset) {
  QG_CHECK(!g_.value(input).type.shape.empty(), kOp, "the graph input '", g_.value(input).name,
           "' needs a leading batch axis");
  batch_ = g_.value(input).type.shape[0];
  // 1. Which values the graph input reaches. Observers cut the chain: in eval mode they are
  //    frozen and their qparams come from their state, whatever the batch holds.
  depends_.assign(static_cast<size_t>(g_.num_values()), false);
  for (NodeId id : g_.topological_order()) {
    const Node& n = g_.node(id);
    if (n.dead || is_observer(n)) continue;
    bool dep = n.op->name == "input";
    for (ValueId in : n.inputs) dep = dep || depends_[in];
    for (ValueId o : n.outputs) depends_[o] = dep;
  }
  QG_CHECK(depends_[output], kOp, "the output '", g_.value(output).name,
           "' does not depend on the graph input");
  // 2. The leaves the output needs: input-independent values read by input-dependent nodes.
  needed_ = g_.needed_nodes({output});
  std::vector<ValueId> leaf_ids;
  for (NodeId id = 0; id < g_.num_nodes(); ++id) {
    const Node& n = g_.node(id);
    if (!needed_[id] || n.dead) continue;
    bool dep = false;
    for (ValueId o : n.outputs) dep = dep || depends_[o];
    if (!dep) continue;
    for (ValueId in : n.inputs)
      if (!depends_[in] && leaves_.emplace(in, Tensor()).second) leaf_ids.push_back(in);
  }
  // 3. Their eval-mode values in one run (inputs fed zeros: leaves do not read them).
  Executor::Feeds feeds;
  for (ValueId in : g_.inputs()) {
    const Value& v = g_.value(in);
    feeds[v.name] = Tensor::zeros(v.type.shape, v.type.dtype);
  }
  std::vector<Tensor> got = exec.run(feeds, leaf_ids);
  for (size_t i = 0; i < leaf_ids.size(); ++i) leaves_[leaf_ids[i]] = got[i].to(Device::cpu());
}

const Tensor& Context::leaf(ValueId v) const {
  auto it = leaves_.find(v);
  QG_CHECK(it != leaves_.end(), kOp, "value '", g_.value(v).name,
           "' is not an input-independent value read by the exported graph");
  return it->second;
}

int Context::uses(ValueId v) const {
  int n = 0;
  for (NodeId c : g_.consumers(v))
    if (needed_[c] && !g_.node(c).dead) ++n;
  return n;
}

std::string Context::base_name(ValueId v) const {
  const Value& val = g_.value(v);
  if (!val.name.empty()) return val.name;
  const Node& n = producer(v);
  std::string base = n.name.empty() ? n.op->name : n.name;
  if (val.index > 0) base += "." + n.op->outputs.at(static_cast<size_t>(val.index));
  return base;
}

std::string Context::output_name(const Node& n, size_t i, const std::string& base) {
  const ValueId v = n.outputs.at(i);
  return fresh(!g_.value(v).name.empty() || base.empty() ? base_name(v) : base);
}

std::string Context::fresh(const std::string& base) {
  std::string name = base.empty() ? "t" : base;
  for (int i = 2; names_.count(name) != 0; ++i) name = base + "_" + std::to_string(i);
  names_.insert(name);
  return name;
}

void Context::bind(ValueId v, const std::string& name) {
  bound_[v] = name;
  names_.insert(name);
}

std::string Context::value(ValueId v) {
  auto it = bound_.find(v);
  if (it != bound_.end()) return it->second;
  if (!depends_[v]) {
    bind(v, emit_leaf(*this, v));
  } else {
    emit_producer(v);
  }
  it = bound_.find(v);
  QG_CHECK(it != bound_.end(), kOp, "the mapper of '", producer(v).op->name,
           "' did not produce output ", g_.value(v).index, " of node '", producer(v).name, "'");
  return it->second;
}

void Context::emit_producer(ValueId v) {
  const Node& n = producer(v);
  QG_CHECK(in_progress_.insert(n.id).second, kOp, "node '", n.name, "' depends on itself");
  const Mapper* m = find_mapper(n.op->name);
  QG_CHECK(m != nullptr, kOp, "op '", n.op->name, "' (node '", n.name,
           "') has no ONNX mapping; the exporter maps the ops of the nn/ models");
  (*m)(*this, n);
  round_outputs(n);
  in_progress_.erase(n.id);
}

// bf16 outputs (a bf16-mixed model). The ops below compute in f32 from their widened inputs
// and round their result to bf16 once (their CPU kernels, math_t<bf16> = f32), so their
// mappers' f32 result is rounded here, once. Data movement is exact in any dtype. cast,
// rope and dynamic_fake_quantize round inside their mappers, at qatgraph's own steps. Any
// other op with a bf16 output has no checked bf16 form: a named error.
void Context::round_outputs(const Node& n) {
  static const std::set<std::string> rounds_once = {
      "matmul", "batched_matmul", "add", "sub", "mul", "div", "relu", "silu", "causal_attention"};
  static const std::set<std::string> exact_or_own = {
      "reshape",   "permute", "transpose", "stop_gradient",
      "embedding", "cast",    "rope",      "dynamic_fake_quantize"};
  for (ValueId o : n.outputs) {
    const DType t = g_.value(o).type.dtype;
    if ((t != DType::bf16 && t != DType::f16) || !bound_.count(o)) continue;
    if (exact_or_own.count(n.op->name)) continue;
    QG_CHECK(rounds_once.count(n.op->name), kOp, n.op->name, " '", n.name, "' has a ",
             dtype_name(t), " output; that op is exported in f32 only");
    bound_[o] = round_to(bound_[o], t, base_name(o), n.op->name + " '" + n.name + "'");
  }
}

std::string Context::node(const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const AttrList& attrs) {
  onnx::NodeProto* p = out_.add_node();
  p->set_op_type(op);
  p->set_name(outputs.at(0));
  for (const auto& i : inputs) p->add_input(i);
  for (const auto& o : outputs) p->add_output(o);
  for (const auto& a : attrs) *p->add_attribute() = a;
  return outputs[0];
}

std::string Context::node1(const std::string& op, const std::vector<std::string>& inputs,
                           const std::string& base, const AttrList& attrs) {
  return node(op, inputs, {fresh(base)}, attrs);
}

std::string Context::initializer(const std::string& base, const Tensor& t, const Shape* shape) {
  Tensor c = t.to(Device::cpu());
  QG_CHECK(c.is_contiguous(), kOp, "initializer '", base, "' is not contiguous");
  const Shape& dims = shape != nullptr ? *shape : c.shape();
  QG_CHECK(shape_numel(dims) == c.numel(), kOp, "initializer '", base, "': shape ", shape_str(dims),
           " does not hold ", c.numel(), " elements");
  onnx::TensorProto* p = out_.add_initializer();
  std::string name = fresh(base);
  p->set_name(name);
  p->set_data_type(onnx_type(c.dtype()));
  for (int64_t d : dims) p->add_dims(d);
  // raw_data is little-endian, as the tensors are on the machines qatgraph runs on.
  p->set_raw_data(std::string(static_cast<const char*>(c.raw_data()), c.nbytes()));
  initializer_bytes_ += static_cast<int64_t>(c.nbytes());
  return name;
}

std::string Context::initializer_f32(const std::string& base, const Shape& shape,
                                     const std::vector<float>& v) {
  return initializer(base, Tensor::from_vector<float>(shape, v));
}

std::string Context::initializer_i8(const std::string& base, const Shape& shape,
                                    const std::vector<int8_t>& v) {
  return initializer(base, Tensor::from_vector<int8_t>(shape, v));
}

std::string Context::initializer_u8(const std::string& base, const Shape& shape,
                                    const std::vector<uint8_t>& v) {
  return initializer(base, Tensor::from_vector<uint8_t>(shape, v));
}

std::string Context::initializer_i64(const std::string& base, const std::vector<int64_t>& v) {
  return initializer(base, Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v));
}

std::string Context::scalar_f32(const std::string& base, float v) {
  return initializer(base, Tensor::from_vector<float>({}, {v}));
}

std::string Context::scalar_f64(const std::string& base, double v) {
  return initializer(base, Tensor::from_vector<double>({}, {v}));
}

std::string Context::initializer_i4(const std::string& base, const Shape& shape,
                                    const std::vector<int8_t>& codes) {
  constexpr int kInt4 = 22;  // TensorProto.INT4 (ONNX 1.16), past ONNX 1.12's enum
  QG_CHECK(opset_ >= 21, kOp, "INT4 initializer '", base, "' needs opset 21, this export is ",
           opset_);
  QG_CHECK(shape_numel(shape) == static_cast<int64_t>(codes.size()), kOp, "INT4 initializer '",
           base, "': shape ", shape_str(shape), " does not hold ", codes.size(), " codes");
  std::string packed((codes.size() + 1) / 2, '\0');
  for (size_t i = 0; i < codes.size(); ++i) {
    QG_CHECK(codes[i] >= -8 && codes[i] <= 7, kOp, "INT4 initializer '", base, "': code ",
             int(codes[i]), " is outside -8..7");
    const auto nibble = static_cast<uint8_t>(codes[i] & 0xf);
    packed[i / 2] = static_cast<char>(static_cast<uint8_t>(packed[i / 2]) |
                                      (i % 2 == 0 ? nibble : nibble << 4));
  }
  onnx::TensorProto* p = out_.add_initializer();
  std::string name = fresh(base);
  p->set_name(name);
  p->set_data_type(kInt4);
  for (int64_t d : shape) p->add_dims(d);
  initializer_bytes_ += static_cast<int64_t>(packed.size());
  p->set_raw_data(std::move(packed));
  return name;
}

std::string Context::reduce(const std::string& op, const std::string& x,
                            const std::vector<int64_t>& axes, const std::string& base) {
  const int64_t axes_input_since = op == "ReduceSum" ? 13 : 18;
  if (opset_ >= axes_input_since) {
    std::vector<std::string> in = {x};
    if (!axes.empty()) in.push_back(initializer_i64(base + ".axes", axes));
    return node1(op, in, base, {attr_int("keepdims", 1)});
  }
  AttrList a = {attr_int("keepdims", 1)};
  if (!axes.empty()) a.push_back(attr_ints("axes", axes));
  return node1(op, {x}, base, a);
}

std::string Context::shared(const std::string& key, const std::function<std::string()>& make) {
  auto it = shared_.find(key);
  if (it != shared_.end()) return it->second;
  return shared_[key] = make();
}

std::string Context::cast(const std::string& x, int to, const std::string& base) {
  return node1("Cast", {x}, base, {attr_int("to", to)});
}

std::string Context::round_to(const std::string& x, DType storage, const std::string& base,
                              const std::string& what) {
  if (storage == DType::f32) return x;
  QG_CHECK(storage == DType::bf16, kOp, what, " is ", dtype_name(storage),
           "; the export writes f32 models and bf16 mixed precision (f16 is not supported)");
  return cast(cast(x, onnx::TensorProto_DataType_BFLOAT16, base + ".bf16"),
              onnx::TensorProto_DataType_FLOAT, base + ".rounded");
}

const Mapper* find_mapper(const std::string& op) {
  static const std::map<std::string, Mapper> table = [] {
    std::map<std::string, Mapper> t;
    add_tensor_mappers(t);
    add_quant_mappers(t);
    add_decoder_mappers(t);
    return t;
  }();
  auto it = table.find(op);
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace qg::onnx_export
