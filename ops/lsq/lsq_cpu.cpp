// CPU kernels for lsq_fake_quantize and lsq_backward. Both walk the scope as runs of
// contiguous elements (ops/quantize/scope_runs.h). The forward of f32/bf16/f16 runs the
// fake-quantize SSE loops (its y is fake_quantize's y); the backward of f32 runs of one
// qparam runs lsq_simd's loop, and everything else the shared element math. Both run on the
// thread pool. The scale and zero-point sums are f64, added in an order fixed by the shape:
// per tensor, per-chunk sums added in chunk order; other scopes, each qparam's terms in
// element order within one task (parallel_scope_runs). Deterministic for any thread count.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/fake_quantize/fake_quantize_simd.h"
#include "ops/lsq/lsq_cpu.h"
#include "ops/lsq/lsq_math.h"
#include "ops/lsq/lsq_simd.h"
#include "ops/quantize/scope_runs.h"

namespace qg {

double lsq_grad_factor(const std::string& op, const Attrs& attrs, int64_t numel) {
  if (attrs.has("grad_factor")) {
    double g = attrs.get_real("grad_factor");
    QG_CHECK(std::isfinite(g), op, "attribute 'grad_factor' = ", g, " must be finite");
    return g;
  }
  QuantRange r = quant_range_from_attrs(op, attrs);
  QG_CHECK(r.qmax > 0, op, "the default grad_factor 1/sqrt(numel * quant_max) needs quant_max > 0",
           ", got quant_max = ", r.qmax, "; pass 'grad_factor' explicitly");
  // An empty tensor has nothing to scale; keep the factor finite.
  if (numel == 0) return 1.0;
  return 1.0 / std::sqrt(static_cast<double>(numel) * static_cast<double>(r.qmax));
}

std::shared_ptr<const KernelArgs> parse_lsq_backward_args(const ArgsSource& s) {
  std::shared_ptr<const KernelArgs> scope = quant_scope_parser(1)(s);
  auto args = std::make_shared<LsqBackwardArgs>();
  static_cast<QuantScopeArgs&>(*args) = dynamic_cast<const QuantScopeArgs&>(*scope);
  args->grad_factor = lsq_grad_factor(s.op, s.attrs, s.inputs[1].numel());
  return args;
}

namespace {

template <typename M>
struct LsqQParams {
  std::vector<M> scale, inv_scale, zp_int;
};

// Scale must be positive and finite; the learnable zero point only finite (it is rounded
// and clamped into range, as it drifts during training).
template <typename M>
LsqQParams<M> load(const std::string& op, const Tensor& scale, const Tensor& zp,
                   const QuantRange& r) {
  LsqQParams<M> q;
  int64_t n = scale.numel();
  q.scale.resize(n);
  q.inv_scale.resize(n);
  q.zp_int.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    double s = scale.at(i), z = zp.at(i);
    check_scale_value(op, s, i);
    QG_CHECK(std::isfinite(z), op, "zero_point[", i, "] = ", z, " must be finite");
    q.scale[i] = static_cast<M>(s);
    q.inv_scale[i] = M(1) / q.scale[i];
    q.zp_int[i] =
        lsq::zero_point_int<M>(static_cast<M>(z), static_cast<M>(r.qmin), static_cast<M>(r.qmax));
  }
  return q;
}

template <typename T>
void forward_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const Tensor& x = ctx.inputs[0];
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  LsqQParams<M> qp = load<M>(ctx.op, ctx.inputs[1], ctx.inputs[2], r);
  const M qmin = static_cast<M>(r.qmin), qmax = static_cast<M>(r.qmax);
  const T* px = x.data<T>();
  T* py = ctx.outputs[0].data<T>();
  parallel_for(x.numel(), kElementGrain, [&](int64_t b, int64_t e) {
    for_each_scope_run_in(l, b, e, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
      if constexpr (std::is_same_v<M, float>) {
        // lsq::forward is qmath::fake_quant's y with the integer zero point, which is what
        // the fake-quantize SSE loops compute bit for bit. Their mask bits land in a
        // per-thread scratch buffer that nobody reads, so it is never cleared, and it is
        // kept between calls (a run is at most one chunk long).
        thread_local std::vector<uint8_t> unused_mask(kElementGrain / 8 + 2);
        if (step == 0)
          fq_simd::fake_quant_run(px + k0, py + k0, unused_mask.data(), 0, len,
                                  {qp.inv_scale[q0], qp.scale[q0], qp.zp_int[q0], qmin, qmax});
        else
          fq_simd::fake_quant_lanes(
              px + k0, py + k0, unused_mask.data(), 0, len,
              {qp.inv_scale.data() + q0, qp.scale.data() + q0, qp.zp_int.data() + q0, qmin, qmax});
      } else {
        for (int64_t j = 0; j < len; ++j) {
          const int64_t k = k0 + j, qi = q0 + step * j;
          py[k] = static_cast<T>(lsq::forward<M>(static_cast<M>(px[k]), qp.inv_scale[qi],
                                                 qp.scale[qi], qp.zp_int[qi], qmin, qmax));
        }
      }
    });
  });
}

template <typename G>
void store_sums(Tensor& out, const std::vector<double>& sums, double g) {
  G* p = out.data<G>();
  for (size_t i = 0; i < sums.size(); ++i) p[i] = static_cast<G>(g * sums[i]);
}

void store(Tensor& out, const std::vector<double>& sums, double g) {
  if (out.dtype() == DType::f64)
    store_sums<double>(out, sums, g);
  else
    store_sums<float>(out, sums, g);
}

// Inputs: dy, x, scale, zero_point. Outputs: dx, dscale, dzero_point.
template <typename T>
void backward_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const Tensor& dy = ctx.inputs[0];
  const Tensor& x = ctx.inputs[1];
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  LsqQParams<M> qp = load<M>(ctx.op, ctx.inputs[2], ctx.inputs[3], r);
  const double g = ctx.args<LsqBackwardArgs>().grad_factor;
  const M qmin = static_cast<M>(r.qmin), qmax = static_cast<M>(r.qmax);
  const T* px = x.data<T>();
  const T* pdy = dy.data<T>();
  T* pdx = ctx.outputs[0].data<T>();
  std::vector<double> dscale(l.num_qparams, 0.0), dzp(l.num_qparams, 0.0);
  // One run's dx, and its sums added into sums[q - q_base] (a task's own slots).
  auto run = [&](int64_t k0, int64_t len, int64_t q0, int64_t step, double* ds, double* dz) {
    if constexpr (std::is_same_v<T, float>) {
      if (step == 0) {  // one qparam for the run: the SSE loop (ops/lsq/lsq_simd.h)
        lsq_simd::RunSums s =
            lsq_simd::backward_run(px + k0, pdy + k0, pdx + k0, len,
                                   {qp.inv_scale[q0], qp.scale[q0], qp.zp_int[q0], qmin, qmax});
        ds[0] += s.dscale;
        dz[0] += s.dzp;
        return;
      }
    }
    for (int64_t j = 0; j < len; ++j) {
      const int64_t k = k0 + j, qi = q0 + step * j;
      auto e = lsq::element_grad<M>(static_cast<M>(px[k]), static_cast<M>(pdy[k]), qp.inv_scale[qi],
                                    qp.scale[qi], qp.zp_int[qi], qmin, qmax);
      pdx[k] = static_cast<T>(e.dx);
      ds[step * j] += e.dscale;
      dz[step * j] += e.dzp;
    }
  };
  if (l.kind == ScopeKind::tensor) {
    // One qparam: per-chunk sums, added in chunk order.
    struct Sums {
      double ds = 0, dz = 0;
    };
    Sums total = parallel_reduce(
        x.numel(), kElementGrain, Sums{},
        [&](int64_t b, int64_t e) {
          Sums s;
          run(b, e - b, 0, 0, &s.ds, &s.dz);
          return s;
        },
        [](Sums a, Sums b) {
          return Sums{a.ds + b.ds, a.dz + b.dz};
        });
    dscale[0] = total.ds;
    dzp[0] = total.dz;
  } else {
    // Tasks own disjoint qparams, so each sum adds in element order, as on one thread.
    parallel_scope_runs(l, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
      run(k0, len, q0, step, &dscale[q0], &dzp[q0]);
    });
  }
  store(ctx.outputs[1], dscale, g);
  store(ctx.outputs[2], dzp, g);
}

}  // namespace

void lsq_fake_quantize_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), "lsq_fake_quantize",
                 [&](auto tag) { forward_typed<decltype(tag)>(ctx); });
}

void lsq_backward_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[1].dtype(), "lsq_backward",
                 [&](auto tag) { backward_typed<decltype(tag)>(ctx); });
}

}  // namespace qg
