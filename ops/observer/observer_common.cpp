#include "ops/observer/observer_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/float_order.h"
#include "core/thread_pool.h"
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_math.h"
#include "ops/quantize/scope_runs.h"

namespace qg {

std::vector<AttrSpec> observer_attrs(const std::vector<AttrSpec>& extra,
                                     const std::vector<std::string>& scopes) {
  std::vector<AttrSpec> a = concat_attrs(quant_range_attrs(true), qparams_attrs());
  a = concat_attrs(a, scope_attrs(scopes));
  a = concat_attrs(a, {bool_attr("replicated", false,
                                 "x is the same on every data-parallel rank (a weight): its "
                                 "statistics need no sync")});
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

namespace {

template <typename Better>
void atomic_improve(int32_t* slot, int32_t v, Better better) {
  int32_t cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
  while (better(v, cur) &&
         !__atomic_compare_exchange_n(slot, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

}  // namespace

void fold_finite_range(const std::string& op, const Tensor& x, const ScopeLayout& l,
                       int64_t* nonfinite, float* mn, float* mx) {
  const float inf = std::numeric_limits<float>::infinity();
  const int32_t empty_lo = order_key(inf), empty_hi = order_key(-inf);
  std::vector<int32_t> lo(static_cast<size_t>(l.num_qparams), empty_lo);
  std::vector<int32_t> hi(static_cast<size_t>(l.num_qparams), empty_hi);
  int64_t count = 0;
  dispatch_float(x.dtype(), op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    parallel_for(x.numel(), kElementGrain, [&](int64_t b, int64_t e) {
      // 1. The qparams this chunk touches, 2. its ranges, 3. merged into the shared ones.
      int64_t q_lo = l.num_qparams, q_hi = 0;
      for_each_scope_run_in(l, b, e, [&](int64_t, int64_t len, int64_t q0, int64_t step) {
        q_lo = std::min(q_lo, q0);
        q_hi = std::max(q_hi, q0 + (step ? len : 1));
      });
      std::vector<int32_t> clo(static_cast<size_t>(q_hi - q_lo), empty_lo);
      std::vector<int32_t> chi(static_cast<size_t>(q_hi - q_lo), empty_hi);
      int64_t bad = 0;
      for_each_scope_run_in(l, b, e, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
        for (int64_t j = 0; j < len; ++j) {
          const float v = static_cast<float>(px[k0 + j]);
          if (!qmath::is_finite(v)) {
            ++bad;
            continue;
          }
          const int32_t k = order_key(v);
          const int64_t q = q0 + step * j - q_lo;
          clo[q] = std::min(clo[q], k);
          chi[q] = std::max(chi[q], k);
        }
      });
      for (size_t q = 0; q < clo.size(); ++q) {
        atomic_improve(&lo[q_lo + q], clo[q], [](int32_t a, int32_t c) { return a < c; });
        atomic_improve(&hi[q_lo + q], chi[q], [](int32_t a, int32_t c) { return a > c; });
      }
      __atomic_fetch_add(&count, bad, __ATOMIC_RELAXED);
    });
  });
  *nonfinite += count;
  for (int64_t q = 0; q < l.num_qparams; ++q) {
    mn[q] = obsmath::ordered_min(mn[q], key_float(lo[q]));
    mx[q] = obsmath::ordered_max(mx[q], key_float(hi[q]));
  }
}

void batch_min_max(const std::string& op, const Tensor& x, const ScopeLayout& l, int64_t* nonfinite,
                   std::vector<float>& mn, std::vector<float>& mx) {
  const float inf = std::numeric_limits<float>::infinity();
  mn.assign(static_cast<size_t>(l.num_qparams), inf);
  mx.assign(static_cast<size_t>(l.num_qparams), -inf);
  fold_finite_range(op, x, l, nonfinite, mn.data(), mx.data());
}

std::vector<std::vector<float>> gather_finite(const std::string& op, const Tensor& x,
                                              const ScopeLayout& l, int64_t* nonfinite) {
  std::vector<std::vector<float>> values(static_cast<size_t>(l.num_qparams));
  for_each_finite(op, x, l, nonfinite, [&](int64_t q, float v) { values[q].push_back(v); });
  return values;
}

void write_qparams(KernelContext& ctx, const std::vector<float>& mn, const std::vector<float>& mx,
                   const std::vector<bool>& valid) {
  qmath::QParamsConfig cfg = ctx.args<ObserverArgs>().cfg;
  float* scale = ctx.outputs[0].data<float>();
  int32_t* zp = ctx.outputs[1].data<int32_t>();
  for (size_t q = 0; q < valid.size(); ++q) {
    qmath::QParams p = qmath::qparams_from_range(mn[q], mx[q], valid[q], cfg);
    scale[q] = p.scale;
    zp[q] = p.zero_point;
  }
}

Communicator* observer_sync(const KernelContext& ctx, const ScopeLayout& l) {
  return observer_sync(ctx, l, ctx.args<ObserverArgs>().replicated);
}

Communicator* observer_sync(const KernelContext& ctx, const ScopeLayout& l, bool replicated) {
  Communicator* comm = ctx.device.statistics_sync();
  if (comm == nullptr || comm->world_size() == 1) return nullptr;
  if (replicated) return nullptr;
  // Statistics indexed by rows of axis 0 (the batch axis) belong to this rank's rows.
  if (l.kind == ScopeKind::token || l.kind == ScopeKind::group ||
      (l.kind == ScopeKind::channel && l.axis == 0))
    return nullptr;
  return comm;
}

void sync_nonfinite(Communicator& comm, int64_t* nonfinite, int64_t before) {
  *nonfinite = before + all_reduce_count(comm, *nonfinite - before);
}

void sync_values(Communicator& comm, std::vector<std::vector<float>>& values) {
  values = all_gather_lists(comm, values);
}

GatheredInput gather_input(Communicator& comm, const Tensor& x, const ScopeLayout& l,
                           void* stream) {
  QG_CHECK(l.kind == ScopeKind::tensor || (l.kind == ScopeKind::channel && l.axis > 0), "observer",
           "only the per-tensor scope and channels off axis 0 gather their inputs");
  QG_CHECK(x.is_contiguous(), "observer", "the gathered input must be contiguous");
  const int64_t ranks = comm.world_size();
  GatheredInput g{Tensor::empty({ranks * x.numel()}, x.dtype(), x.device()), l};
  g.layout.outer = l.outer * ranks;
  comm.all_gather(x.raw_data(), g.x.raw_data(), static_cast<int64_t>(x.nbytes()), stream);
  return g;
}

void check_real_in(const std::string& op, const std::string& attr, double value, double lo,
                   double hi) {
  QG_CHECK(value > lo && value <= hi, op, "attribute '", attr, "' = ", value, " is outside (", lo,
           ", ", hi, "]");
}

}  // namespace qg
