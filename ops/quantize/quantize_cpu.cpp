// CPU kernels for quantize, quantize_backward, dequantize and dequantize_backward. Each walks
// the [outer, axis, inner] view of the scope (ops/common/quant_scope.h); the per-element
// math is ops/quantize/quantize_math.h, shared with the CUDA kernels. The element-wise ones
// run on the thread pool in chunks fixed by the element count; dequantize_backward in tasks
// that own disjoint qparams (per tensor: one task), so its sums keep the element order.
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/common/bitmask.h"
#include "ops/common/quant_args.h"
#include "ops/common/quant_scope.h"
#include "ops/quantize/quantize_cpu.h"
#include "ops/quantize/quantize_math.h"
#include "ops/quantize/scope_runs.h"

namespace qg {

QuantRange storage_range(DType dtype) {
  QuantRange r;
  r.is_signed = dtype == DType::i8;
  r.qmin = r.is_signed ? -128 : 0;
  r.qmax = r.is_signed ? 127 : 255;
  return r;
}

DType quantize_storage_dtype(const std::string& op, const Attrs& attrs, const QuantRange& r) {
  if (!r.custom) {
    int64_t bits = attrs.get_int("bits");
    QG_CHECK(bits <= 8, op, "attribute 'bits' = ", bits, " exceeds 8: storage is s8/u8");
  }
  const std::string& want = attrs.get_string("out_dtype");
  DType d = want == "i8"   ? DType::i8
            : want == "u8" ? DType::u8
            : r.qmin < 0   ? DType::i8
                           : DType::u8;
  QuantRange s = storage_range(d);
  QG_CHECK(r.qmin >= s.qmin && r.qmax <= s.qmax, op, "quant range [", r.qmin, ", ", r.qmax,
           "] does not fit attribute 'out_dtype' = ", want, " (", dtype_name(d), " holds [", s.qmin,
           ", ", s.qmax, "])");
  return d;
}

namespace {

// Scales (with reciprocals) and integer zero points, validated: scale positive and finite,
// zero point within `r`.
template <typename M>
struct QParams {
  std::vector<M> scale, inv_scale, zp;
};

template <typename M>
QParams<M> load(const std::string& op, const Tensor& scale, const Tensor* zp, const QuantRange& r) {
  QParams<M> q;
  int64_t n = scale.numel();
  q.scale.resize(n);
  q.inv_scale.resize(n);
  q.zp.assign(n, M(0));
  for (int64_t i = 0; i < n; ++i) {
    check_scale_value(op, scale.at(i), i);
    q.scale[i] = static_cast<M>(scale.at(i));
    q.inv_scale[i] = M(1) / q.scale[i];
    if (zp != nullptr) {
      check_zero_point_value(op, zp->at(i), r, i);
      q.zp[i] = static_cast<M>(zp->at(i));
    }
  }
  return q;
}

template <typename T, typename Q>
void quantize_typed(KernelContext& ctx, const QuantRange& r, const ScopeLayout& l) {
  using M = math_t<T>;
  QParams<M> qp = load<M>(ctx.op, ctx.inputs[1], &ctx.inputs[2], r);
  const M qmin = static_cast<M>(r.qmin), qmax = static_cast<M>(r.qmax);
  const T* px = ctx.inputs[0].data<T>();
  Q* pq = ctx.outputs[0].data<Q>();
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  // Elements arrive in order, so mask bits gather in a register and each byte is stored
  // once (a read-modify-write per element would chain every element on the last store).
  // Pointers captured by value: the byte stores to pq may alias anything, so values reached
  // through references would be reloaded after every store. Chunks are whole mask bytes.
  const M* inv = qp.inv_scale.data();
  const M* zp = qp.zp.data();
  parallel_for(ctx.inputs[0].numel(), kElementGrain, [=](int64_t b, int64_t e) {
    uint32_t bits = 0;
    for_each_scoped_in(l, b, e, [=, &bits](int64_t k, int64_t qi) QG_ELEMENT {
      qstore::Code c = qstore::quantize<M>(static_cast<M>(px[k]), inv[qi], zp[qi], qmin, qmax);
      pq[k] = static_cast<Q>(c.q);
      bits |= static_cast<uint32_t>(c.in_range) << (k & 7);
      if ((k & 7) == 7) {
        mask[k >> 3] = static_cast<uint8_t>(bits);
        bits = 0;
      }
    });
    if (e & 7) mask[e >> 3] = static_cast<uint8_t>(bits);
  });
}

template <typename Q, typename T>
void dequantize_typed(KernelContext& ctx, const ScopeLayout& l) {
  using M = math_t<T>;
  QParams<M> qp =
      load<M>(ctx.op, ctx.inputs[1], &ctx.inputs[2], storage_range(ctx.inputs[0].dtype()));
  const Q* pq = ctx.inputs[0].data<Q>();
  T* py = ctx.outputs[0].data<T>();
  parallel_for(ctx.inputs[0].numel(), kElementGrain, [&](int64_t b, int64_t e) {
    for_each_scoped_in(l, b, e, [&](int64_t k, int64_t qi) QG_ELEMENT {
      py[k] = static_cast<T>(qstore::dequantize<M>(pq[k], qp.scale[qi], qp.zp[qi]));
    });
  });
}

template <typename Fn>
void dispatch_storage(DType d, Fn&& fn) {
  if (d == DType::i8)
    fn(int8_t{});
  else
    fn(uint8_t{});
}

}  // namespace

void quantize_cpu(KernelContext& ctx) {
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  dispatch_float(ctx.inputs[0].dtype(), "quantize", [&](auto t) {
    dispatch_storage(ctx.outputs[0].dtype(),
                     [&](auto q) { quantize_typed<decltype(t), decltype(q)>(ctx, r, l); });
  });
}

// Inputs dy, mask, scale; dy is cast to dx's dtype first (the gradient reaching an integer
// value may come in another float type), then dx = dy / scale where the mask is set.
void quantize_backward_cpu(KernelContext& ctx) {
  Tensor& dx = ctx.outputs[0];
  Tensor dy = ctx.inputs[0].dtype() == dx.dtype() ? ctx.inputs[0] : ctx.inputs[0].cast(dx.dtype());
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  const uint8_t* mask = ctx.inputs[1].data<uint8_t>();
  dispatch_float(dx.dtype(), "quantize_backward", [&](auto tag) {
    using T = decltype(tag);
    using M = math_t<T>;
    QParams<M> qp = load<M>(ctx.op, ctx.inputs[2], nullptr, QuantRange{});
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(dx.numel(), kElementGrain, [&](int64_t b, int64_t e) {
      for_each_scoped_in(l, b, e, [&](int64_t k, int64_t qi) QG_ELEMENT {
        pdx[k] = static_cast<T>(
            qstore::quantize_grad<M>(static_cast<M>(pdy[k]), qp.scale[qi], bitmask_get(mask, k)));
      });
    });
  });
}

void dequantize_cpu(KernelContext& ctx) {
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  dispatch_storage(ctx.inputs[0].dtype(), [&](auto q) {
    dispatch_float(ctx.outputs[0].dtype(), "dequantize",
                   [&](auto t) { dequantize_typed<decltype(q), decltype(t)>(ctx, l); });
  });
}

// Inputs dy, q, scale, zero_point; outputs dq = dy * scale (dy's dtype, the straight-through
// gradient handed on to quantize) and dscale = sum over the scope of dy * (q - zp), in f64.
void dequantize_backward_cpu(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& q = ctx.inputs[1];
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  std::vector<double> dscale(l.num_qparams, 0.0);
  dispatch_storage(q.dtype(), [&](auto qtag) {
    using Q = decltype(qtag);
    const Q* pq = q.data<Q>();
    dispatch_float(dy.dtype(), "dequantize_backward", [&](auto tag) {
      using T = decltype(tag);
      using M = math_t<T>;
      QParams<M> qp = load<M>(ctx.op, ctx.inputs[2], &ctx.inputs[3], storage_range(q.dtype()));
      const T* pdy = dy.data<T>();
      T* pdq = ctx.outputs[0].data<T>();
      // Tasks own disjoint qparams: each sum adds in element order, as on one thread.
      parallel_scope_runs(l, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
        for (int64_t j = 0; j < len; ++j) {
          const int64_t k = k0 + j, qi = q0 + step * j;
          M d = static_cast<M>(pdy[k]);
          pdq[k] = static_cast<T>(d * qp.scale[qi]);
          dscale[qi] += static_cast<double>(d) * (static_cast<double>(pq[k]) - qp.zp[qi]);
        }
      });
    });
  });
  Tensor& ds = ctx.outputs[1];
  for (int64_t i = 0; i < l.num_qparams; ++i) {
    if (ds.dtype() == DType::f64)
      ds.data<double>()[i] = dscale[i];
    else
      ds.data<float>()[i] = static_cast<float>(dscale[i]);
  }
}

}  // namespace qg
