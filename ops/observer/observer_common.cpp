#include "ops/observer/observer_common.h"
#include "ops/observer/observer_math.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace qg {

std::vector<AttrSpec> observer_attrs(const std::vector<AttrSpec>& extra,
                                     const std::vector<std::string>& scopes) {
  std::vector<AttrSpec> a = concat_attrs(quant_range_attrs(true), qparams_attrs());
  a = concat_attrs(a, scope_attrs(scopes));
  return concat_attrs(a, extra);
}

AttrSpec delayed_attr() {
  return bool_attr("delayed", false,
                   "output the qparams of the state before this batch (the previous step's)");
}

bool delayed(const Attrs& attrs) {
  return attrs.has("delayed") && attrs.get_bool("delayed");
}

std::vector<TensorType> infer_observer_outputs(const InferContext& ctx) {
  expect_float(ctx, 0);
  qparams_config_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  return {TensorType{DType::f32, l.qparam_shape}, TensorType{DType::i32, l.qparam_shape}};
}

void append_common_states(std::vector<StateSpec>& states) {
  states.push_back({"nonfinite_count", {DType::i64, {1}}, 0});
  states.push_back({"observer_enabled", {DType::u8, {1}}, 1});
}

CommonStates common_states(KernelContext& ctx, size_t own) {
  QG_CHECK(ctx.states.size() == own + 2, ctx.op, "expected ", own + 2, " state tensors, got ",
           ctx.states.size());
  CommonStates s;
  s.nonfinite = ctx.states[own].data<int64_t>();
  s.enabled = ctx.states[own + 1].data<uint8_t>()[0] != 0;
  return s;
}

bool should_update(const KernelContext& ctx, const CommonStates& s) {
  return ctx.training && s.enabled && ctx.inputs[0].numel() > 0;
}

void batch_min_max(const std::string& op, const Tensor& x, const ScopeLayout& l, int64_t* nonfinite,
                   std::vector<float>& mn, std::vector<float>& mx) {
  const float inf = std::numeric_limits<float>::infinity();
  mn.assign(static_cast<size_t>(l.num_qparams), inf);
  mx.assign(static_cast<size_t>(l.num_qparams), -inf);
  for_each_finite(op, x, l, nonfinite, [&](int64_t q, float v) {
    mn[q] = obsmath::ordered_min(mn[q], v);
    mx[q] = obsmath::ordered_max(mx[q], v);
  });
}

std::vector<std::vector<float>> gather_finite(const std::string& op, const Tensor& x,
                                              const ScopeLayout& l, int64_t* nonfinite) {
  std::vector<std::vector<float>> values(static_cast<size_t>(l.num_qparams));
  for_each_finite(op, x, l, nonfinite, [&](int64_t q, float v) { values[q].push_back(v); });
  return values;
}

void write_qparams(KernelContext& ctx, const std::vector<float>& mn, const std::vector<float>& mx,
                   const std::vector<bool>& valid) {
  qmath::QParamsConfig cfg = qparams_config_from_attrs(ctx.op, ctx.attrs);
  float* scale = ctx.outputs[0].data<float>();
  int32_t* zp = ctx.outputs[1].data<int32_t>();
  for (size_t q = 0; q < valid.size(); ++q) {
    qmath::QParams p = qmath::qparams_from_range(mn[q], mx[q], valid[q], cfg);
    scale[q] = p.scale;
    zp[q] = p.zero_point;
  }
}

void check_real_in(const std::string& op, const std::string& attr, double value, double lo,
                   double hi) {
  QG_CHECK(value > lo && value <= hi, op, "attribute '", attr, "' = ", value, " is outside (", lo,
           ", ", hi, "]");
}

}  // namespace qg
