// CPU kernels for fake_quantize and ste_backward. The per-element math is qmath::fake_quant,
// shared with the CUDA kernels. f32/f16/bf16 go through the SSE loops of
// fake_quantize_simd.h wherever the [outer, axis, inner] view gives runs of contiguous
// elements whose qparams are constant (or contiguous themselves); other layouts and f64 walk
// the view element by element, so each element's qparams index needs no division.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/fake_quantize/fake_quantize_cpu.h"
#include "ops/fake_quantize/fake_quantize_simd.h"

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

// Runs shorter than this go element by element: the vector loop works a mask byte at a time.
constexpr int64_t kMinRun = 8;

fq_simd::RunQParams run_qparams(const HostQParams<float>& qp, int64_t i, float qmin, float qmax) {
  return {qp.inv_scale[i], qp.scale[i], qp.zero_point[i], qmin, qmax};
}
fq_simd::LaneQParams lane_qparams(const HostQParams<float>& qp, int64_t i, float qmin, float qmax) {
  return {qp.inv_scale.data() + i, qp.scale.data() + i, qp.zero_point.data() + i, qmin, qmax};
}

// The vector path: splits the tensor into runs of contiguous elements with constant qparams
// (per tensor, per token, per channel / per group with the axis outside a long enough inner
// extent) or with contiguous qparams (per channel on the last axis, per group across a long
// enough inner extent). Returns false, having written nothing, for any other layout.
template <typename T>
bool fake_quantize_runs(const ScopeLayout& l, const HostQParams<float>& qp, float qmin, float qmax,
                        const T* x, T* y, uint8_t* mask) {
  const int64_t row = l.axis_len * l.inner;  // elements per outer index
  auto run = [&](int64_t k, int64_t n, int64_t qi) {
    fq_simd::fake_quant_run(x + k, y + k, mask, k, n, run_qparams(qp, qi, qmin, qmax));
  };
  auto lanes = [&](int64_t k, int64_t n, int64_t qi) {
    fq_simd::fake_quant_lanes(x + k, y + k, mask, k, n, lane_qparams(qp, qi, qmin, qmax));
  };
  switch (l.kind) {
    case ScopeKind::tensor:
      run(0, l.outer, 0);
      return true;
    case ScopeKind::token:
      for (int64_t o = 0; o < l.outer; ++o) run(o * row, row, o);
      return true;
    case ScopeKind::channel:
      if (l.inner == 1) {
        if (l.axis_len < kMinRun) return false;
        for (int64_t o = 0; o < l.outer; ++o) lanes(o * row, row, 0);
        return true;
      }
      if (l.inner < kMinRun) return false;
      for (int64_t o = 0; o < l.outer; ++o)
        for (int64_t a = 0; a < l.axis_len; ++a) run(o * row + a * l.inner, l.inner, a);
      return true;
    case ScopeKind::group:
      if (l.inner == 1) {
        if (l.group_size < kMinRun) return false;
        for (int64_t o = 0; o < l.outer; ++o)
          for (int64_t g = 0; g < l.num_groups; ++g) {
            int64_t a = g * l.group_size;
            run(o * row + a, std::min(l.group_size, l.axis_len - a), o * l.num_groups + g);
          }
        return true;
      }
      if (l.inner < kMinRun) return false;
      for (int64_t o = 0; o < l.outer; ++o)
        for (int64_t a = 0; a < l.axis_len; ++a)
          lanes(o * row + a * l.inner, l.inner, qparam_index(l, o, a, 0));
      return true;
  }
  return false;
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
  if constexpr (std::is_same_v<M, float>) {
    if (fake_quantize_runs(l, qp, qmin, qmax, px, py, mask)) return;
  }
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
    fq_simd::ste_backward(ctx.inputs[0].data<T>(), ctx.inputs[1].data<uint8_t>(),
                          ctx.outputs[0].data<T>(), ctx.outputs[0].numel());
  });
}

}  // namespace qg
