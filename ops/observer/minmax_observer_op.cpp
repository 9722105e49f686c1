// minmax_observer(x) -> (scale, zero_point): a stateful node keeping the running min and max
// of every finite value seen (per tensor, or per channel along `axis`), and turning them into
// qparams exactly as PyTorch's MinMaxObserver / PerChannelMinMaxObserver do.
// State: min, max (f32, +inf/-inf until a finite value arrives), nonfinite_count (i64),
// observer_enabled (u8). Statistics update only in training mode with the flag set.
#include <cmath>
#include <limits>

#include "core/graph.h"
#include "core/half.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/common/schema_helpers.h"

namespace qg {
namespace {

std::vector<TensorType> infer_observer(const InferContext& ctx) {
  expect_float(ctx, 0);
  qparams_config_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  return {TensorType{DType::f32, l.qparam_shape}, TensorType{DType::i32, l.qparam_shape}};
}

std::vector<StateSpec> observer_states(const InferContext& ctx) {
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  const double inf = std::numeric_limits<double>::infinity();
  return {{"min", {DType::f32, {l.num_qparams}}, inf},
          {"max", {DType::f32, {l.num_qparams}}, -inf},
          {"nonfinite_count", {DType::i64, {1}}, 0},
          {"observer_enabled", {DType::u8, {1}}, 1}};
}

template <typename T>
void observe(const Tensor& x, const ScopeLayout& l, float* mn, float* mx, int64_t* nonfinite) {
  const T* px = x.data<T>();
  int64_t k = 0;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t a = 0; a < l.axis_len; ++a)
      for (int64_t i = 0; i < l.inner; ++i, ++k) {
        float v = static_cast<float>(px[k]);
        if (!std::isfinite(v)) {
          ++*nonfinite;
          continue;
        }
        int64_t q = qparam_index(l, o, a, i);
        mn[q] = std::min(mn[q], v);
        mx[q] = std::max(mx[q], v);
      }
}

void minmax_observer_cpu(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, x.shape());
  qmath::QParamsConfig cfg = qparams_config_from_attrs(ctx.op, ctx.attrs);
  float* mn = ctx.states[0].data<float>();
  float* mx = ctx.states[1].data<float>();
  int64_t* nonfinite = ctx.states[2].data<int64_t>();
  bool enabled = ctx.states[3].data<uint8_t>()[0] != 0;
  if (ctx.training && enabled) {
    dispatch_float(x.dtype(), "minmax_observer",
                   [&](auto tag) { observe<decltype(tag)>(x, l, mn, mx, nonfinite); });
  }
  float* scale = ctx.outputs[0].data<float>();
  int32_t* zp = ctx.outputs[1].data<int32_t>();
  for (int64_t q = 0; q < l.num_qparams; ++q) {
    qmath::QParams p = qmath::qparams_from_range(mn[q], mx[q], mn[q] <= mx[q], cfg);
    scale[q] = p.scale;
    zp[q] = p.zero_point;
  }
}

}  // namespace

void define_observer_ops(OpRegistry& r) {
  OpDef& op = r.define("minmax_observer");
  op.doc = "Running min/max observer producing (scale, zero_point) as PyTorch's MinMaxObserver.";
  op.inputs = {"x"};
  op.outputs = {"scale", "zero_point"};
  op.attrs = concat_attrs(concat_attrs(quant_range_attrs(true), qparams_attrs()),
                          scope_attrs({"tensor", "channel"}));
  op.infer = infer_observer;
  op.states = observer_states;
  op.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, minmax_observer_cpu});
}

}  // namespace qg
