// CPU kernels for fake_quantize and ste_backward, run on the thread pool in chunks fixed by
// the element count (core/thread_pool.h). The per-element math is qmath::fake_quant, shared
// with the CUDA kernels; f32/f16/bf16 go through the SSE loops of fake_quantize_simd.h.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/fake_quantize/fake_quantize_cpu.h"
#include "ops/fake_quantize/fake_quantize_simd.h"
#include "ops/quantize/scope_runs.h"

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
  const T* px = x.data<T>();
  T* py = ctx.outputs[0].data<T>();
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  const int64_t n = x.numel();
  parallel_for(n, kElementGrain, [&](int64_t b, int64_t e) {
    std::memcpy(py + b, px + b, static_cast<size_t>(e - b) * sizeof(T));
    std::memset(mask + b / 8, 0xff, static_cast<size_t>((e - b) / 8));
    if (int tail = static_cast<int>((e - b) & 7))  // only the last chunk has a tail
      mask[e / 8] = static_cast<uint8_t>((1u << tail) - 1);
  });
}

fq_simd::RunQParams run_qparams(const HostQParams<float>& qp, int64_t i, float qmin, float qmax) {
  return {qp.inv_scale[i], qp.scale[i], qp.zero_point[i], qmin, qmax};
}
fq_simd::LaneQParams lane_qparams(const HostQParams<float>& qp, int64_t i, float qmin, float qmax) {
  return {qp.inv_scale.data() + i, qp.scale.data() + i, qp.zero_point.data() + i, qmin, qmax};
}

// Chunks of kElementGrain elements (a multiple of 8: each mask byte belongs to one chunk),
// each cut into runs of contiguous elements whose qparams are constant (step 0) or
// contiguous themselves (step 1). f32/f16/bf16 runs take the SSE loops, f64 the scalar math:
// both give every element what qmath::fake_quant gives it, however the runs are cut.
template <typename T>
void fake_quantize_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const Tensor& x = ctx.inputs[0];
  if (!ctx.states.empty() && ctx.states[0].data<uint8_t>()[0] == 0) {
    fake_quantize_disabled<T>(ctx);
    return;
  }
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  HostQParams<M> qp = load_qparams<M>(ctx.op, ctx.inputs[1], ctx.inputs[2], r);
  const M qmin = static_cast<M>(r.qmin), qmax = static_cast<M>(r.qmax);
  const T* px = x.data<T>();
  T* py = ctx.outputs[0].data<T>();
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  parallel_for(x.numel(), kElementGrain, [&](int64_t b, int64_t e) {
    std::memset(mask + b / 8, 0, static_cast<size_t>((e - b + 7) / 8));
    for_each_scope_run_in(l, b, e, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
      if constexpr (std::is_same_v<M, float>) {
        if (step == 0)
          fq_simd::fake_quant_run(px + k0, py + k0, mask, k0, len, run_qparams(qp, q0, qmin, qmax));
        else
          fq_simd::fake_quant_lanes(px + k0, py + k0, mask, k0, len,
                                    lane_qparams(qp, q0, qmin, qmax));
      } else {
        for (int64_t j = 0, k = k0; j < len; ++j, ++k) {
          const int64_t qi = q0 + step * j;
          auto res = qmath::fake_quant<M>(static_cast<M>(px[k]), qp.inv_scale[qi], qp.scale[qi],
                                          qp.zero_point[qi], qmin, qmax);
          py[k] = static_cast<T>(res.y);
          mask[k >> 3] |= static_cast<uint8_t>(res.in_range) << (k & 7);
        }
      }
    });
  });
}

}  // namespace

void fake_quantize_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), "fake_quantize",
                 [&](auto tag) { fake_quantize_typed<decltype(tag)>(ctx); });
}

namespace {
template <bool kExact>
void ste_backward_cpu_impl(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    const T* dy = ctx.inputs[0].data<T>();
    const uint8_t* mask = ctx.inputs[1].data<uint8_t>();
    T* dx = ctx.outputs[0].data<T>();
    // Chunks start at multiples of the grain (a multiple of 8), so each owns whole mask bytes.
    parallel_for(ctx.outputs[0].numel(), kElementGrain, [&](int64_t b, int64_t e) {
      if constexpr (kExact)
        fq_simd::ste_backward_exact(dy + b, mask + b / 8, dx + b, e - b);
      else
        fq_simd::ste_backward(dy + b, mask + b / 8, dx + b, e - b);
    });
  });
}
}  // namespace

void ste_backward_cpu(KernelContext& ctx) {
  ste_backward_cpu_impl<false>(ctx);
}
void ste_backward_exact_cpu(KernelContext& ctx) {
  ste_backward_cpu_impl<true>(ctx);
}

}  // namespace qg
