// quantize(x, scale, zero_point) -> (q, mask): real s8/u8 storage per tensor, channel, token
// or group; dequantize(q, scale, zero_point) -> x'. The quantize mask (1 bit per element,
// as fake_quantize's) is all its backward needs: dx = dy / scale * mask. Dequantize passes
// dq = dy * scale back, so quantize -> dequantize is the straight-through estimator.
#include "core/graph.h"
#include "ops/common/bitmask.h"
#include "ops/common/quant_args.h"
#include "ops/common/quant_scope.h"
#include "ops/common/schema_helpers.h"
#include "ops/quantize/quantize_cpu.h"

namespace qg {
namespace {

const std::vector<std::string> kFloatNames = {"f32", "f64", "f16", "bf16"};

void expect_scale(const InferContext& ctx, int i, const ScopeLayout& l) {
  QG_CHECK(ctx.inputs[i].dtype == DType::f32 || ctx.inputs[i].dtype == DType::f64, ctx.op,
           "scale must be f32 or f64, got ", ctx.inputs[i].str());
  expect_qparam_shape(ctx.op, "scale", ctx.inputs[i], l);
  if (const Tensor* s = ctx.constant_inputs[i])
    for (int64_t k = 0; k < s->numel(); ++k) check_scale_value(ctx.op, s->at(k), k);
}

void expect_zero_point(const InferContext& ctx, int i, const ScopeLayout& l, const QuantRange& r) {
  QG_CHECK(ctx.inputs[i].dtype == DType::i32 || ctx.inputs[i].dtype == DType::i64, ctx.op,
           "zero_point must be i32 or i64, got ", ctx.inputs[i].str());
  expect_qparam_shape(ctx.op, "zero_point", ctx.inputs[i], l);
  if (const Tensor* z = ctx.constant_inputs[i])
    for (int64_t k = 0; k < z->numel(); ++k) check_zero_point_value(ctx.op, z->at(k), r, k);
}

void expect_storage(const InferContext& ctx, int i) {
  QG_CHECK(ctx.inputs[i].dtype == DType::i8 || ctx.inputs[i].dtype == DType::u8, ctx.op,
           "q must be i8 or u8 storage, got ", ctx.inputs[i].str());
}

// The scope attributes of a forward node, for its backward node.
Attrs scope_subset(const Attrs& a) {
  return {{"scope", a.at("scope")}, {"axis", a.at("axis")}, {"group_size", a.at("group_size")}};
}

std::vector<TensorType> infer_quantize(const InferContext& ctx) {
  expect_float(ctx, 0);
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  DType storage = quantize_storage_dtype(ctx.op, ctx.attrs, r);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  expect_scale(ctx, 1, l);
  expect_zero_point(ctx, 2, l, r);
  return {TensorType{storage, ctx.inputs[0].shape},
          TensorType{DType::u8, {bitmask_bytes(ctx.inputs[0].numel())}}};
}

std::vector<TensorType> infer_quantize_backward(const InferContext& ctx) {
  expect_float(ctx, 0);
  QG_CHECK(ctx.inputs[1].dtype == DType::u8 && ctx.inputs[1].shape.size() == 1, ctx.op,
           "mask must be a 1-D u8 bit mask, got ", ctx.inputs[1].str());
  int64_t want = bitmask_bytes(ctx.inputs[0].numel());
  QG_CHECK(ctx.inputs[1].shape[0] == want, ctx.op, "mask has ", ctx.inputs[1].shape[0],
           " bytes but dy ", ctx.inputs[0].str(), " needs ", want);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  expect_scale(ctx, 2, l);
  return {TensorType{dtype_from_name(ctx.attrs.get_string("dx_dtype")), ctx.inputs[0].shape}};
}

std::vector<TensorType> infer_dequantize(const InferContext& ctx) {
  expect_storage(ctx, 0);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  expect_scale(ctx, 1, l);
  expect_zero_point(ctx, 2, l, storage_range(ctx.inputs[0].dtype));
  return {TensorType{dtype_from_name(ctx.attrs.get_string("out_dtype")), ctx.inputs[0].shape}};
}

std::vector<TensorType> infer_dequantize_backward(const InferContext& ctx) {
  expect_float(ctx, 0);
  expect_storage(ctx, 1);
  QG_CHECK(ctx.inputs[0].shape == ctx.inputs[1].shape, ctx.op, "dy ", ctx.inputs[0].str(),
           " must have the shape of q ", ctx.inputs[1].str());
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[1].shape);
  expect_scale(ctx, 2, l);
  expect_zero_point(ctx, 3, l, storage_range(ctx.inputs[1].dtype));
  return {ctx.inputs[0], ctx.inputs[2]};
}

// Reference for quantize's gradient, from SEMANTICS.md in f64: dx = dy / scale where
// qmin <= rint(x * (1 / scale)) + zp <= qmax.
std::vector<Tensor> quantize_reference(const std::vector<Tensor>& in, const Tensor& dy,
                                       const Attrs& attrs) {
  QuantRange r = quant_range_from_attrs("quantize", attrs);
  ScopeLayout l = scope_layout("quantize", attrs, in[0].shape());
  Tensor dx = Tensor::zeros(in[0].shape(), DType::f64);
  for (int64_t o = 0, k = 0; o < l.outer; ++o)
    for (int64_t a = 0; a < l.axis_len; ++a)
      for (int64_t i = 0; i < l.inner; ++i, ++k) {
        int64_t qi = qparam_index(l, o, a, i);
        double s = in[1].at(qi);
        double q = std::nearbyint(in[0].at(k) * (1.0 / s)) + in[2].at(qi);
        dx.data<double>()[k] = (q >= r.qmin && q <= r.qmax) ? dy.at(k) / s : 0.0;
      }
  return {dx, Tensor(), Tensor()};
}

GradcheckSample quantize_sample(const std::string& label, Shape x, Shape qshape, Attrs attrs,
                                double scale, int64_t zp) {
  int64_t nq = shape_numel(qshape);
  std::vector<double> sv(nq), zv(nq, static_cast<double>(zp));
  for (int64_t i = 0; i < nq; ++i) sv[i] = scale * (1.0 + 0.25 * i);
  GradcheckSample s(label,
                    {{x, DType::f64, -3.0, 3.0, {}},
                     {qshape, DType::f64, 0, 0, sv},
                     {qshape, DType::i32, 0, 0, zv}},
                    std::move(attrs));
  s.reference = quantize_reference;
  return s;
}

// dequantize is linear in scale, so central differences check dscale exactly.
GradcheckSample dequantize_sample(const std::string& label, Shape q, DType qtype, Shape qshape,
                                  Attrs attrs, int64_t zp) {
  int64_t n = shape_numel(q), nq = shape_numel(qshape);
  std::vector<double> qv(n);
  for (int64_t i = 0; i < n; ++i)
    qv[i] = qtype == DType::i8 ? static_cast<double>((i * 37) % 256 - 128)
                               : static_cast<double>((i * 53) % 256);
  attrs.set("out_dtype", "f64");
  return GradcheckSample(label,
                         {{q, qtype, 0, 0, qv},
                          {qshape, DType::f64, 0.05, 0.5, {}},
                          {qshape, DType::i32, 0, 0, std::vector<double>(nq, double(zp))}},
                         std::move(attrs));
}

std::vector<GradcheckSample> quantize_samples() {
  return {
      quantize_sample("per-tensor u8 [4,6]", {4, 6}, {1}, {}, 0.02, 128),
      quantize_sample("per-tensor s8 [3,5]", {3, 5}, {}, {{"signed", true}}, 0.015, -3),
      quantize_sample("per-channel axis -1 [3,4] s4-in-i8", {3, 4}, {4},
                      {{"scope", "channel"}, {"axis", -1}, {"bits", 4}, {"signed", true}}, 0.2, 0),
      quantize_sample("per-token [2,3,4]", {2, 3, 4}, {2, 3, 1}, {{"scope", "token"}}, 0.015, 100),
      quantize_sample("per-group 3 axis 1 [2,7]", {2, 7}, {2, 3},
                      {{"scope", "group"}, {"axis", 1}, {"group_size", 3}, {"signed", true}}, 0.03,
                      -1),
  };
}

}  // namespace

void add_quantize_cuda_kernels(OpRegistry& r);  // quantize_cuda.cu
void add_quantize_crosscheck(OpRegistry& r);    // quantize_crosscheck.cpp

void define_quantize_ops(OpRegistry& r) {
  OpDef& q = r.define("quantize");
  q.parse_args = quant_scope_parser(0);
  q.doc = "Quantize to s8/u8 storage with tensor qparams; outputs q and a bit-packed mask.";
  q.inputs = {"x", "scale", "zero_point"};
  q.outputs = {"q", "mask"};
  q.attrs = concat_attrs(quant_range_attrs(), scope_attrs());
  q.attrs.push_back(string_attr("out_dtype", "auto", {"auto", "i8", "u8"},
                                "storage dtype; auto: i8 when quant_min < 0, else u8"));
  q.differentiable_inputs = {true, false, false};
  q.infer = infer_quantize;
  q.kernels.push_back({DeviceType::cpu, kFloatDTypes, quantize_cpu});
  q.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    if (c.output_grads[0] == kNoValue) return {kNoValue, kNoValue, kNoValue};
    Attrs a = scope_subset(c.node.attrs);
    a.set("dx_dtype", dtype_name(c.graph.value(c.node.inputs[0]).type.dtype));
    ValueId dx = c.graph.apply1("quantize_backward",
                                {c.output_grads[0], c.node.outputs[1], c.node.inputs[1]}, a);
    return {dx, kNoValue, kNoValue};
  };
  q.gradcheck_samples = quantize_samples;

  OpDef& qb = r.define("quantize_backward");
  qb.parse_args = quant_scope_parser(0);
  qb.doc = "Backward of quantize: dx = dy / scale where the bit-packed mask is set, else 0.";
  qb.inputs = {"dy", "mask", "scale"};
  qb.outputs = {"dx"};
  qb.attrs = scope_attrs();
  qb.attrs.push_back(string_attr("dx_dtype", "f32", kFloatNames, "dtype of dx (that of x)"));
  qb.infer = infer_quantize_backward;
  qb.kernels.push_back({DeviceType::cpu, kFloatDTypes, quantize_backward_cpu});

  OpDef& dq = r.define("dequantize");
  dq.parse_args = quant_scope_parser(0);
  dq.doc = "x' = (q - zero_point) * scale from s8/u8 storage, per tensor, channel, token, group.";
  dq.inputs = {"q", "scale", "zero_point"};
  dq.outputs = {"y"};
  dq.attrs = scope_attrs();
  dq.attrs.push_back(string_attr("out_dtype", "f32", kFloatNames, "output float dtype"));
  dq.differentiable_inputs = {true, true, false};
  dq.infer = infer_dequantize;
  dq.kernels.push_back({DeviceType::cpu, {DType::i8, DType::u8}, dequantize_cpu});
  dq.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    std::vector<ValueId> g = c.graph.apply(
        "dequantize_backward", {c.grad_or_zeros(0), n.inputs[0], n.inputs[1], n.inputs[2]},
        scope_subset(n.attrs));
    return {c.needs_input_grad[0] ? g[0] : kNoValue, c.needs_input_grad[1] ? g[1] : kNoValue,
            kNoValue};
  };
  dq.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        dequantize_sample("per-tensor i8 [3,5]", {3, 5}, DType::i8, {1}, {}, -4),
        dequantize_sample("per-channel u8 axis 0 [3,4]", {3, 4}, DType::u8, {3},
                          {{"scope", "channel"}, {"axis", 0}}, 128),
        dequantize_sample("per-token i8 [2,3,4]", {2, 3, 4}, DType::i8, {2, 3, 1},
                          {{"scope", "token"}}, 0),
        dequantize_sample("per-group 4 axis -1 [2,9] u8", {2, 9}, DType::u8, {2, 3},
                          {{"scope", "group"}, {"axis", -1}, {"group_size", 4}}, 7),
    };
  };

  OpDef& db = r.define("dequantize_backward");
  db.parse_args = quant_scope_parser(1);
  db.doc = "Backward of dequantize: dq = dy * scale, dscale = sum over the scope of dy * (q - zp).";
  db.inputs = {"dy", "q", "scale", "zero_point"};
  db.outputs = {"dq", "dscale"};
  db.attrs = scope_attrs();
  db.infer = infer_dequantize_backward;
  db.kernels.push_back({DeviceType::cpu, kFloatDTypes, dequantize_backward_cpu});
#ifdef QG_WITH_CUDA
  add_quantize_cuda_kernels(r);
#endif
  add_quantize_crosscheck(r);
}

}  // namespace qg
