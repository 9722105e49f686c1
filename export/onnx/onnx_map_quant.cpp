// Mappers of the activation quantizers.
//
// fake_quantize (static, frozen observer) -> QuantizeLinear -> [Clip] -> DequantizeLinear with
// the observer's scale and zero point. uint8/int8 ranges are the storage type's own; a
// narrower range (4-bit activations, 0..15) adds a Clip on the uint8 codes, which is exact
// (clamp(clamp(q, 0, 255), 0, 15) = clamp(q, 0, 15)) but not a pattern runtimes fuse.
// QuantizeLinear divides (x / scale) where qatgraph multiplies by the reciprocal
// (SEMANTICS.md); the two round differently only when x / scale lands within an ulp of a
// half-integer, and then the code differs by one.
//
// dynamic_range_quantize (per-token or per-tensor affine, torchao's 8da4w) has no ONNX
// operator: DynamicQuantizeLinear is per tensor and uint8 only. It is spelled out in f32 ops
// that repeat ops/dynamic_quant/dynamic_quant_math.h step for step, so it is exact:
//   min_neg = min(ReduceMin(x), 0), max_pos = max(ReduceMax(x), 0)
//   scale0  = (max_pos - min_neg) / (qmax - qmin)
//   unit    = isinf(1 / scale0)            (an all-zero row, or a range too small to invert)
//   scale   = unit ? 1 : scale0,  inv = 1 / scale
//   zp      = unit ? clamp(0) : clamp(qmin - round(min_neg / scale0), qmin, qmax)
//   q       = clamp(round(x * inv) + zp, qmin, qmax)  (Round is half to even, as rint)
// and the dequantize that follows is (q - zp) * scale. Non-finite inputs are not skipped by
// ReduceMin/ReduceMax as they are in qatgraph (the digits inputs are finite).
//
// dynamic_fake_quantize per token, asymmetric (the dynamic recipes' activations), likewise in
// f32 ops, as ops/dynamic_fake_quantize/dynamic_fake_quantize_math.h computes an f32 x:
//   scale = max((max_pos - min_neg) * f32(1 / (qmax - qmin)), eps)
//   zp    = clamp(qmin - round(min_neg / scale), qmin, qmax)
//   y     = (clamp(round(x * (1 / scale)) + zp, qmin, qmax) - zp) * scale
// For a bf16 x (a bf16-mixed model) every qparam step is rounded to bf16 as that header
// rounds it (T(...) there), the element math stays f32, and y is rounded once.
#include "core/error.h"
#include "export/onnx/onnx_context.h"
#include "ops/common/quant_attrs.h"

namespace qg::onnx_export {
namespace {

constexpr const char* kOp = "export.onnx";

std::string strip(const std::string& s, const std::string& suffix) {
  if (s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0)
    return s.substr(0, s.size() - suffix.size());
  return s;
}

void map_fake_quantize(Context& ctx, const Node& n) {
  const QuantRange r = quant_range_from_attrs(kOp, n.attrs);
  const std::string& scope = n.attrs.get_string("scope");
  QG_CHECK(scope == "tensor" || scope == "channel", kOp, "fake_quantize '", n.name, "': scope ",
           scope, " has no QuantizeLinear form (per tensor or per channel)");
  const bool u8 = r.qmin >= 0 && r.qmax <= 255;
  QG_CHECK(u8 || (r.qmin >= -128 && r.qmax <= 127), kOp, "fake_quantize '", n.name, "': range [",
           r.qmin, ", ", r.qmax,
           "] does not fit int8 or uint8 (the QuantizeLinear types of opset 17)");
  const std::string base = strip(n.name, ".fq");
  const Tensor& scale = ctx.leaf(n.inputs[1]);
  const Tensor& zp = ctx.leaf(n.inputs[2]);
  const Shape qshape = scope == "tensor" ? Shape{} : Shape{scale.numel()};
  std::vector<float> s(static_cast<size_t>(scale.numel()));
  for (int64_t i = 0; i < scale.numel(); ++i) s[i] = static_cast<float>(scale.at(i));
  std::string sname = ctx.initializer_f32(base + "_scale", qshape, s), zname, lo, hi;
  auto typed = [&](const std::string& name, const std::vector<double>& v, const Shape& shape) {
    if (u8) return ctx.initializer_u8(name, shape, std::vector<uint8_t>(v.begin(), v.end()));
    return ctx.initializer_i8(name, shape, std::vector<int8_t>(v.begin(), v.end()));
  };
  std::vector<double> z = zp.to_doubles();
  for (double v : z)
    QG_CHECK(v >= r.qmin && v <= r.qmax, kOp, "fake_quantize '", n.name, "': zero point ", v,
             " is outside [", r.qmin, ", ", r.qmax, "]");
  zname = typed(base + "_zero_point", z, qshape);
  AttrList axis;
  if (scope == "channel") axis.push_back(attr_int("axis", n.attrs.get_int("axis")));
  std::string q = ctx.node1("QuantizeLinear", {ctx.value(n.inputs[0]), sname, zname},
                            base + "_quantized", axis);
  const bool full = u8 ? (r.qmin == 0 && r.qmax == 255) : (r.qmin == -128 && r.qmax == 127);
  if (!full) {
    lo = typed(base + "_qmin", {static_cast<double>(r.qmin)}, {});
    hi = typed(base + "_qmax", {static_cast<double>(r.qmax)}, {});
    q = ctx.node1("Clip", {q, lo, hi}, base + "_quantized_clipped");
  }
  ctx.bind(n.outputs[0], ctx.node("DequantizeLinear", {q, sname, zname},
                                  {ctx.output_name(n, 0, base + "_dequantized")}, axis));
}

void map_dynamic_range_quantize(Context& ctx, const Node& n) {
  const QuantRange r = quant_range_from_attrs(kOp, n.attrs);
  const std::string& scope = n.attrs.get_string("scope");
  QG_CHECK(n.attrs.get_string("mode") == "affine" && (scope == "token" || scope == "tensor"), kOp,
           "dynamic_range_quantize '", n.name,
           "': only the affine per-token and per-tensor forms "
           "are exported (got ",
           n.attrs.get_string("mode"), " per ", scope, ")");
  const std::string base = strip(n.name, ".dynq");
  const std::string x = ctx.value(n.inputs[0]);
  const float qmin = static_cast<float>(r.qmin), qmax = static_cast<float>(r.qmax);
  const float unit_zp = qmin > 0 ? qmin : (qmax < 0 ? qmax : 0.0f);
  const std::vector<int64_t> axes =
      scope == "token" ? std::vector<int64_t>{-1} : std::vector<int64_t>{};
  auto c = [&](const std::string& what, float v) { return ctx.scalar_f32(base + "." + what, v); };
  auto op = [&](const char* type, const std::vector<std::string>& in, const std::string& what,
                const AttrList& a = {}) { return ctx.node1(type, in, base + "." + what, a); };
  const std::string zero = c("zero", 0.0f), one = c("one", 1.0f);
  const std::string lo = c("qmin", qmin), hi = c("qmax", qmax);
  std::string min_neg =
      op("Min", {ctx.reduce("ReduceMin", x, axes, base + ".min"), zero}, "min_neg");
  std::string max_pos =
      op("Max", {ctx.reduce("ReduceMax", x, axes, base + ".max"), zero}, "max_pos");
  std::string scale0 =
      op("Div", {op("Sub", {max_pos, min_neg}, "range"), c("levels", qmax - qmin)}, "scale0");
  std::string unit = op("IsInf", {op("Div", {one, scale0}, "inv0")}, "unit");
  std::string scale = op("Where", {unit, one, scale0}, "scale");
  std::string inv = op("Div", {one, scale}, "inv");
  std::string zp_raw = op(
      "Sub", {lo, op("Round", {op("Div", {min_neg, scale0}, "min_steps")}, "min_code")}, "zp_raw");
  std::string zp = op("Where", {unit, c("unit_zp", unit_zp), op("Clip", {zp_raw, lo, hi}, "zp_c")},
                      "zero_point");
  std::string q = op("Round", {op("Mul", {x, inv}, "x_inv")}, "rounded");
  q = op("Clip", {op("Add", {q, zp}, "shifted"), lo, hi}, "codes");
  ctx.bind(n.outputs[0], q);
  ctx.bind(n.outputs[1], scale);
  ctx.bind(n.outputs[2], zp);
}

void map_dynamic_fake_quantize(Context& ctx, const Node& n) {
  QG_CHECK(n.attrs.get_string("mode") == "asymmetric" && n.attrs.get_int("group_size") == 0, kOp,
           "dynamic_fake_quantize '", n.name,
           "': only the asymmetric per-token form (activations) is exported; weights are "
           "converted to integers first (got mode ",
           n.attrs.get_string("mode"), ", group_size ", n.attrs.get_int("group_size"), ")");
  const std::string base = strip(n.name, ".dfq");
  const std::string what = "dynamic_fake_quantize '" + n.name + "'";
  const DType in_type = ctx.graph().value(n.inputs[0]).type.dtype;
  const DType out_type = ctx.graph().value(n.outputs[0]).type.dtype;
  const std::string x = ctx.value(n.inputs[0]);
  const float qmin = static_cast<float>(n.attrs.get_int("quant_min"));
  const float qmax = static_cast<float>(n.attrs.get_int("quant_max"));
  const float eps = static_cast<float>(n.attrs.get_real("eps"));
  const std::vector<int64_t> axes = {-1};
  auto c = [&](const std::string& what, float v) { return ctx.scalar_f32(base + "." + what, v); };
  auto op = [&](const char* type, const std::vector<std::string>& in, const std::string& what,
                const AttrList& a = {}) { return ctx.node1(type, in, base + "." + what, a); };
  // Each qparam step rounded to the input's dtype, as dynamic_fake_quantize_math.h does (a
  // no-op for f32).
  auto r = [&](const std::string& v, const std::string& step) {
    return ctx.round_to(v, in_type, base + "." + step, what);
  };
  const std::string zero = c("zero", 0.0f), one = c("one", 1.0f);
  const std::string lo = c("qmin", qmin), hi = c("qmax", qmax);
  std::string min_neg =
      op("Min", {ctx.reduce("ReduceMin", x, axes, base + ".min"), zero}, "min_neg");
  std::string max_pos =
      op("Max", {ctx.reduce("ReduceMax", x, axes, base + ".max"), zero}, "max_pos");
  std::string range = r(op("Sub", {max_pos, min_neg}, "range"), "range");
  std::string scale0 =
      r(op("Mul", {range, c("inv_levels", 1.0f / (qmax - qmin))}, "scale0"), "scale0");
  // torch.clamp(min=eps) in the math type; below eps the scale is eps rounded to the input's
  // dtype. In f32 that is max(scale0, eps); a NaN scale stays NaN either way.
  std::string scale;
  if (in_type == DType::f32) {
    scale = op("Max", {scale0, c("eps", eps)}, "scale");
  } else {
    const std::string floor = r(c("eps", eps), "eps");
    scale =
        op("Where", {op("Less", {scale0, c("eps_f32", eps)}, "below_eps"), floor, scale0}, "scale");
  }
  std::string steps = r(op("Div", {min_neg, scale}, "min_steps"), "min_steps");
  std::string zp_raw =
      r(op("Sub", {lo, r(op("Round", {steps}, "min_code"), "min_code")}, "zp_raw"), "zp_raw");
  std::string zp = op("Clip", {zp_raw, lo, hi}, "zero_point");
  // The element math in f32 (inv = 1 / scale unrounded), then one rounding to the output.
  std::string inv = op("Div", {one, scale}, "inv");
  std::string q = op("Round", {op("Mul", {x, inv}, "x_inv")}, "rounded");
  q = op("Clip", {op("Add", {q, zp}, "shifted"), lo, hi}, "codes");
  std::string d = op("Sub", {q, zp}, "centered");
  if (out_type == DType::f32) {
    ctx.bind(n.outputs[0], ctx.node("Mul", {d, scale}, {ctx.output_name(n, 0, base + ".fq")}));
  } else {
    ctx.bind(n.outputs[0], ctx.round_to(op("Mul", {d, scale}, "fq_f32"), out_type, base, what));
  }
  ctx.bind(n.outputs[2], scale);
  ctx.bind(n.outputs[3], zp);
}

// dequantize of dynamic codes (weights' dequantize nodes are leaves: onnx_weights.cpp).
void map_dequantize(Context& ctx, const Node& n) {
  const NodeId src = ctx.graph().value(n.inputs[0]).producer;
  for (ValueId in : n.inputs)
    QG_CHECK(ctx.graph().value(in).producer == src &&
                 ctx.producer(in).op->name == "dynamic_range_quantize",
             kOp, "dequantize '", n.name,
             "' reads input-dependent codes that do not come from one dynamic_range_quantize");
  const std::string base = strip(n.name, ".dequantize");
  std::string q = ctx.value(n.inputs[0]), s = ctx.value(n.inputs[1]), z = ctx.value(n.inputs[2]);
  std::string d = ctx.node1("Sub", {q, z}, base + ".centered");
  ctx.bind(n.outputs[0], ctx.node("Mul", {d, s}, {ctx.output_name(n)}));
}

}  // namespace

void add_quant_mappers(std::map<std::string, Mapper>& t) {
  t["fake_quantize"] = map_fake_quantize;
  t["dynamic_range_quantize"] = map_dynamic_range_quantize;
  t["dynamic_fake_quantize"] = map_dynamic_fake_quantize;
  t["dequantize"] = map_dequantize;
}

}  // namespace qg::onnx_export
