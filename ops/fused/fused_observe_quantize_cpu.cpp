// The CPU single-loop path for fused observer + fake_quantize on f32: per tensor, one
// vectorisable statistics pass and one quantize pass; per channel with the channel as the
// outermost axis, both passes run row by row while the row is still in cache. Results are
// bit-identical to the unfused kernels (tests/passes/fusion_test.cpp checks it):
//  * statistics follow obsmath::ordered_min/ordered_max (-0 wins the min, +0 the max), done
//    as plain min/max plus a record of which zero signs were seen;
//  * rounding uses the 2^23 trick, equal to rint for |v| < 2^23 up to the sign of a zero
//    result, which the following "+ zero_point" (never -0) erases;
//  * SSE2 (the x86-64 baseline) does four lanes at a time with the same IEEE operations.
// Anything else (f64/f16/bf16, other scopes, the fake-quant flag off) runs the two original
// kernels.
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/graph.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/fused/fused_observe_quantize.h"
#include "ops/observer/observer_math.h"

namespace qg {
namespace {

struct Stats {
  float mn = INFINITY, mx = -INFINITY;
  int64_t nonfinite = 0;
};

// Statistics of n contiguous values.
Stats batch_stats(const float* x, int64_t n) {
  float mn = INFINITY, mx = -INFINITY;
  uint32_t neg0 = 0, pos0 = 0;
  int64_t nonfinite = 0;
  int64_t i = 0;
#if defined(__SSE2__)
  // Four lanes at a time. Non-finite lanes are replaced by +/-inf before min/max, so
  // _mm_min_ps/_mm_max_ps never see NaN; the sign of a zero extreme is fixed below.
  const __m128 sign = _mm_set1_ps(-0.0f), inf = _mm_set1_ps(INFINITY),
               ninf = _mm_set1_ps(-INFINITY);
  const __m128 zero = _mm_setzero_ps();
  __m128 vmn = inf, vmx = ninf, vneg0 = zero, vpos0 = zero;
  __m128i vcnt = _mm_setzero_si128();
  for (; i + 4 <= n; i += 4) {
    __m128 v = _mm_loadu_ps(x + i);
    __m128 finite = _mm_cmplt_ps(_mm_andnot_ps(sign, v), inf);
    vmn = _mm_min_ps(vmn, _mm_or_ps(_mm_and_ps(finite, v), _mm_andnot_ps(finite, inf)));
    vmx = _mm_max_ps(vmx, _mm_or_ps(_mm_and_ps(finite, v), _mm_andnot_ps(finite, ninf)));
    vcnt = _mm_sub_epi32(
        vcnt, _mm_castps_si128(_mm_andnot_ps(finite, _mm_castsi128_ps(_mm_set1_epi32(-1)))));
    __m128 is_zero = _mm_cmpeq_ps(v, zero);
    __m128 negative = _mm_castsi128_ps(_mm_srai_epi32(_mm_castps_si128(v), 31));
    vneg0 = _mm_or_ps(vneg0, _mm_and_ps(is_zero, negative));
    vpos0 = _mm_or_ps(vpos0, _mm_andnot_ps(negative, is_zero));
  }
  alignas(16) float lo[4], hi[4];
  alignas(16) int32_t cnt[4];
  _mm_store_ps(lo, vmn);
  _mm_store_ps(hi, vmx);
  _mm_store_si128(reinterpret_cast<__m128i*>(cnt), vcnt);
  for (int k = 0; k < 4; ++k) {
    mn = lo[k] < mn ? lo[k] : mn;
    mx = hi[k] > mx ? hi[k] : mx;
    nonfinite += cnt[k];
  }
  neg0 = _mm_movemask_ps(vneg0) != 0;
  pos0 = _mm_movemask_ps(vpos0) != 0;
#endif
  for (; i < n; ++i) {
    float v = x[i];
    bool finite = std::fabs(v) < INFINITY;
    nonfinite += finite ? 0 : 1;
    float lo_v = finite ? v : INFINITY, hi_v = finite ? v : -INFINITY;
    mn = lo_v < mn ? lo_v : mn;
    mx = hi_v > mx ? hi_v : mx;
    bool is_zero = v == 0.0f;
    neg0 |= is_zero && std::signbit(v);
    pos0 |= is_zero && !std::signbit(v);
  }
  // -0 wins the min and +0 the max when a zero is the extreme.
  if (mn == 0.0f) mn = neg0 ? -0.0f : 0.0f;
  if (mx == 0.0f) mx = pos0 ? 0.0f : -0.0f;
  return {mn, mx, nonfinite};
}

// Fake-quantizes n contiguous values starting at flat index `first` (a multiple of 8).
void quantize_run(const float* x, float* y, uint8_t* mask, int64_t first, int64_t n, float scale,
                  float zp, float qmin, float qmax) {
  const float inv = 1.0f / scale;
  int64_t i = 0;
#if defined(__SSE2__)
  // rint through the 2^23 trick: (t + copysign(2^23, t)) - copysign(2^23, t) rounds half to
  // even for |t| < 2^23; larger |t| (and inf, NaN) are already integral or pass through.
  const __m128 sign = _mm_set1_ps(-0.0f), big = _mm_set1_ps(8388608.0f);
  const __m128 vinv = _mm_set1_ps(inv), vscale = _mm_set1_ps(scale), vzp = _mm_set1_ps(zp);
  const __m128 vqmin = _mm_set1_ps(qmin), vqmax = _mm_set1_ps(qmax);
  for (; i + 8 <= n; i += 8) {
    int bits = 0;
    for (int h = 0; h < 2; ++h) {
      __m128 v = _mm_loadu_ps(x + i + 4 * h);
      __m128 t = _mm_mul_ps(v, vinv);
      __m128 m = _mm_or_ps(big, _mm_and_ps(t, sign));
      __m128 r = _mm_sub_ps(_mm_add_ps(t, m), m);
      __m128 small = _mm_cmplt_ps(_mm_andnot_ps(sign, t), big);
      r = _mm_or_ps(_mm_and_ps(small, r), _mm_andnot_ps(small, t));
      __m128 q = _mm_add_ps(r, vzp);
      __m128 in = _mm_and_ps(_mm_cmpge_ps(q, vqmin), _mm_cmple_ps(q, vqmax));
      __m128 c = _mm_min_ps(_mm_max_ps(q, vqmin), vqmax);
      __m128 out = _mm_mul_ps(_mm_sub_ps(c, vzp), vscale);
      __m128 nan = _mm_cmpunord_ps(v, v);  // NaN in, the same NaN out
      _mm_storeu_ps(y + i + 4 * h, _mm_or_ps(_mm_and_ps(nan, v), _mm_andnot_ps(nan, out)));
      bits |= _mm_movemask_ps(in) << (4 * h);
    }
    mask[(first + i) >> 3] = static_cast<uint8_t>(bits);
  }
#endif
  for (; i + 8 <= n; i += 8) {
    uint32_t bits = 0;
    for (int e = 0; e < 8; ++e) {
      auto r = qmath::fake_quant<float>(x[i + e], inv, scale, zp, qmin, qmax);
      y[i + e] = r.y;
      bits |= static_cast<uint32_t>(r.in_range) << e;
    }
    mask[(first + i) >> 3] = static_cast<uint8_t>(bits);
  }
  for (; i < n; ++i) {
    auto r = qmath::fake_quant<float>(x[i], inv, scale, zp, qmin, qmax);
    y[i] = r.y;
    int64_t k = first + i;
    mask[k >> 3] =
        static_cast<uint8_t>((mask[k >> 3] & ~(1u << (k & 7))) | (uint32_t{r.in_range} << (k & 7)));
  }
}

struct Observer {
  bool moving_average;
  bool delayed;  // return the qparams of the state before the update
  float c;
  bool update;
  float* mn;
  float* mx;
  uint8_t* init;
  int64_t* nonfinite;
  qmath::QParamsConfig cfg;
};

// The observer's update of channel q and the resulting qparams (as the observer kernels).
qmath::QParams observe(Observer& o, int64_t q, const Stats& b) {
  auto state_qparams = [&] {
    bool valid = o.moving_average ? o.init[q] != 0 : o.mn[q] <= o.mx[q];
    return qmath::qparams_from_range(o.mn[q], o.mx[q], valid, o.cfg);
  };
  const qmath::QParams before = o.delayed ? state_qparams() : qmath::QParams{};
  if (o.update) *o.nonfinite += b.nonfinite;
  if (o.moving_average) {
    if (o.update && b.mn <= b.mx) {
      if (o.init[q]) {
        o.mn[q] = obsmath::moving_average(o.mn[q], b.mn, o.c);
        o.mx[q] = obsmath::moving_average(o.mx[q], b.mx, o.c);
      } else {
        o.mn[q] = b.mn;
        o.mx[q] = b.mx;
        o.init[q] = 1;
      }
    }
  } else if (o.update) {
    o.mn[q] = obsmath::ordered_min(o.mn[q], b.mn);
    o.mx[q] = obsmath::ordered_max(o.mx[q], b.mx);
  }
  return o.delayed ? before : state_qparams();
}

bool try_fast_path(KernelContext& ctx) {
  const Node& obs = ctx.node.fused_from.at(0);
  const Node& fq = ctx.node.fused_from.at(1);
  const Tensor& x = ctx.inputs[0];
  if (fq.op->name != "fake_quantize" || x.dtype() != DType::f32) return false;
  size_t s = 0;
  Observer o{};
  o.moving_average = obs.op->name == "moving_average_observer";
  o.delayed = obs.attrs.has("delayed") && obs.attrs.get_bool("delayed");
  o.mn = ctx.states.at(s++).data<float>();
  o.mx = ctx.states.at(s++).data<float>();
  o.init = o.moving_average ? ctx.states.at(s++).data<uint8_t>() : nullptr;
  o.nonfinite = ctx.states.at(s++).data<int64_t>();
  bool enabled = ctx.states.at(s++).data<uint8_t>()[0] != 0;
  if (s < ctx.states.size() && ctx.states[s].data<uint8_t>()[0] == 0) return false;  // fq off
  o.update = ctx.training && enabled && x.numel() > 0;
  o.c = o.moving_average ? static_cast<float>(obs.attrs.get_real("averaging_constant")) : 0.0f;
  o.cfg = qparams_config_from_attrs(obs.op->name, obs.attrs);
  QuantRange r = quant_range_from_attrs(fq.op->name, fq.attrs);
  ScopeLayout l = scope_layout(obs.op->name, obs.attrs, x.shape());
  bool rows = l.kind == ScopeKind::channel && l.outer == 1 && l.inner % 8 == 0;
  if (l.kind != ScopeKind::tensor && !rows) return false;

  const float* px = x.data<float>();
  float* py = ctx.outputs[0].data<float>();
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  float* scale = ctx.outputs[2].data<float>();
  int32_t* zp = ctx.outputs[3].data<int32_t>();
  const float qmin = static_cast<float>(r.qmin), qmax = static_cast<float>(r.qmax);
  int64_t nrows = rows ? l.axis_len : 1, len = rows ? l.inner : x.numel();
  if (ctx.outputs[1].numel() > 0) std::memset(mask, 0, ctx.outputs[1].nbytes());
  for (int64_t q = 0; q < nrows; ++q) {
    const float* xr = px + q * len;
    Stats b = o.update ? batch_stats(xr, len) : Stats{};
    qmath::QParams p = observe(o, q, b);
    scale[q] = p.scale;
    zp[q] = p.zero_point;
    quantize_run(xr, py + q * len, mask, q * len, len, p.scale, static_cast<float>(p.zero_point),
                 qmin, qmax);
  }
  return true;
}

}  // namespace

void fused_observe_quantize_cpu(KernelContext& ctx) {
  if (!try_fast_path(ctx)) run_fused_observe_quantize_composed(ctx, DeviceType::cpu);
}

}  // namespace qg
