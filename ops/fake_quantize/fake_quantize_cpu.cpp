// CPU kernels for fake_quantize and ste_backward. The per-element math is qmath::fake_quant,
// shared with the CUDA kernels; the loop walks the [outer, axis, inner] view so each
// element's qparams index needs no division.
#include <cstring>

#include "core/half.h"
#include "ops/common/bitmask.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/fake_quantize/fake_quantize_cpu.h"

namespace qg {
namespace {

template <typename M>
struct HostQParams {
  std::vector<M> scale, inv_scale, zero_point;
};

// Reads and validates the qparams (scale > 0 and finite, zp within range).
template <typename M>
HostQParams<M> load_qparams(const std::string& op, const Tensor& scale, const Tensor& zp,
                            const QuantRange& r) {
  HostQParams<M> q;
  int64_t n = scale.numel();
  q.scale.resize(n);
  q.inv_scale.resize(n);
  q.zero_point.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    double s = scale.at(i), z = zp.at(i);
    check_scale_value(op, s, i);
    check_zero_point_value(op, z, r, i);
    q.scale[i] = static_cast<M>(s);
    q.inv_scale[i] = M(1) / q.scale[i];
    q.zero_point[i] = static_cast<M>(z);
  }
  return q;
}

// fake_quant_enabled == 0 (PyTorch's FakeQuantize flag): y = x and every mask bit set, so
// the STE backward passes dy through unchanged. Bits past the last element stay 0.
template <typename T>
void fake_quantize_disabled(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.numel() == 0) return;
  std::memcpy(ctx.outputs[0].data<T>(), x.data<T>(), x.nbytes());
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  std::memset(mask, 0xff, ctx.outputs[1].nbytes());
  if (int tail = static_cast<int>(x.numel() & 7))
    mask[ctx.outputs[1].numel() - 1] = static_cast<uint8_t>((1u << tail) - 1);
}

template <typename T>
void fake_quantize_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const Tensor& x = ctx.inputs[0];
  if (!ctx.states.empty() && ctx.states[0].data<uint8_t>()[0] == 0) {
    fake_quantize_disabled<T>(ctx);
    return;
  }
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, x.shape());
  HostQParams<M> qp = load_qparams<M>(ctx.op, ctx.inputs[1], ctx.inputs[2], r);
  const M qmin = static_cast<M>(r.qmin), qmax = static_cast<M>(r.qmax);
  const T* px = x.data<T>();
  T* py = ctx.outputs[0].data<T>();
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  if (ctx.outputs[1].numel() > 0) std::memset(mask, 0, ctx.outputs[1].nbytes());
  int64_t k = 0;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t a = 0; a < l.axis_len; ++a)
      for (int64_t i = 0; i < l.inner; ++i, ++k) {
        int64_t qi = qparam_index(l, o, a, i);
        auto res = qmath::fake_quant<M>(static_cast<M>(px[k]), qp.inv_scale[qi], qp.scale[qi],
                                        qp.zero_point[qi], qmin, qmax);
        py[k] = static_cast<T>(res.y);
        mask[k >> 3] |= static_cast<uint8_t>(res.in_range) << (k & 7);
      }
}

}  // namespace

void fake_quantize_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), "fake_quantize",
                 [&](auto tag) { fake_quantize_typed<decltype(tag)>(ctx); });
}

void ste_backward_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), "ste_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* dy = ctx.inputs[0].data<T>();
    const uint8_t* mask = ctx.inputs[1].data<uint8_t>();
    T* dx = ctx.outputs[0].data<T>();
    for (int64_t i = 0, n = ctx.outputs[0].numel(); i < n; ++i)
      dx[i] = bitmask_get(mask, i) ? dy[i] : T(0);
  });
}

}  // namespace qg
