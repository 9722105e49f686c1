#include "nn/learned_ranges.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/op_call.h"

namespace qg::nn {
namespace {

constexpr const char* kOp = "nn.learned_ranges";

// torchao's floor on a scale it turns into a parameter ("stabilize range learning").
constexpr double kScaleFloor = 1e-9;

// The parameter node a weight quantizer's [out, in] source reads: the source itself, or the
// parameter a reshape flattens into it (a conv kernel).
NodeId weight_parameter(const Graph& g, ValueId source, const std::string& layer) {
  const Node& n = g.node(g.value(source).producer);
  if (n.op->name == "parameter") return g.value(source).producer;
  if (n.op->name == "reshape") {
    const NodeId p = g.value(n.inputs[0]).producer;
    if (g.node(p).op->name == "parameter") return p;
  }
  QG_FAIL(kOp, "layer '", layer, "': learned ranges start from the weight's own value, but its ",
          "weight is computed by '", n.op->name, "' (node '", n.name, "'), not a parameter");
}

// The parameter dtype of a learned scale: lsq_fake_quantize learns f32 or f64 scales.
DType scale_dtype(DType parameter) {
  return parameter == DType::f64 ? DType::f64 : DType::f32;
}

}  // namespace

Tensor initial_weight_scale(const Tensor& w, const QConfig& qc, DType dtype) {
  QG_CHECK(w.dim() == 2, kOp, "a weight quantizer reads an [out, in] matrix, got ", w.str());
  QG_CHECK(dtype == DType::f32 || dtype == DType::f64, kOp, "learned scales are f32 or f64, not ",
           dtype_name(dtype));
  Attrs attrs = dynamic_weight_attrs(qc, w.dtype());
  if (qc.weight_scope == "group")
    attrs.set("group_size", std::min<int64_t>(qc.weight_group_size, w.size(1)));
  auto ctx = make_device_context(Device::cpu());
  const Tensor host = w.device().is_cpu() && w.is_contiguous() ? w : w.to(Device::cpu());
  // Outputs y, mask, scale (f32), zero point (0 for symmetric weights).
  const Tensor scale = call_op(*ctx, "dynamic_fake_quantize", {host}, attrs)[2];
  std::vector<double> v = scale.to_doubles();
  for (double& s : v) s = std::max(s, kScaleFloor);
  return Tensor::from_doubles(scale.shape(), v, dtype);
}

std::vector<ValueId> learned_scales(const std::vector<WeightQuantizer>& weights) {
  std::vector<ValueId> out;
  for (const WeightQuantizer& w : weights)
    if (w.learned_scale != kNoValue) out.push_back(w.learned_scale);
  return out;
}

void initialize_learned_ranges(Executor& exec, const std::vector<WeightQuantizer>& weights,
                               const QConfig& qc) {
  const Graph& g = exec.graph();
  // Every scale is computed before any is written, so a failure changes nothing.
  std::vector<std::pair<Tensor*, Tensor>> updates;
  for (const WeightQuantizer& w : weights) {
    if (w.learned_scale == kNoValue) continue;
    const Tensor& value = exec.state(weight_parameter(g, w.source, w.layer), "value");
    const Shape matrix = g.value(w.source).type.shape;
    Tensor& dst = exec.state(g.value(w.learned_scale).producer, "value");
    updates.emplace_back(
        &dst, initial_weight_scale(value.to(Device::cpu()).reshape(matrix), qc, dst.dtype()));
  }
  for (auto& [dst, t] : updates) {
    QG_CHECK(t.shape() == dst->shape(), kOp, "a learned scale is ", dst->str(),
             " but its weight's qparams are ", t.str());
    copy_bytes(dst->raw_data(), dst->device(), t.raw_data(), t.device(), dst->nbytes());
  }
}

ValueId Builder::learned_weight(WeightQuantizer& rec, int64_t group, const std::string& name) {
  const NodeId param = weight_parameter(g_, rec.source, rec.layer);
  const Shape matrix = g_.value(rec.source).type.shape;
  const Tensor init = initial_weight_scale(g_.node(param).value.reshape(matrix), qc_,
                                           scale_dtype(precision_.parameter));
  rec.learned_scale = g_.parameter(name + "_scale", init);
  params_.push_back(rec.learned_scale);
  ValueId zero = g_.constant(Tensor::zeros(init.shape(), init.dtype()), name + "_zero_point");
  const Attrs dyn = dynamic_weight_attrs(qc_, g_.value(rec.source).type.dtype);
  Attrs attrs{{"quant_min", dyn.get_int("quant_min")},
              {"quant_max", dyn.get_int("quant_max")},
              // torchao's gradient: autograd through a straight-through round, unscaled.
              {"grad_factor", 1.0}};
  if (qc_.weight_scope == "group") {
    attrs.set("scope", "group");
    attrs.set("axis", 1);
    attrs.set("group_size", group);
  } else {
    attrs.set("scope", "channel");
    attrs.set("axis", 0);
  }
  return g_.apply1("lsq_fake_quantize", {rec.source, rec.learned_scale, zero}, attrs,
                   name + ".lsq");
}

}  // namespace qg::nn
