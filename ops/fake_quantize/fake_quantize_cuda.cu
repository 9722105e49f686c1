// CUDA kernels for fake_quantize and ste_backward. One thread owns one mask byte (8
// elements, one Pack8), so the bit-packed mask is written without atomics. The element math
// is qmath::fake_quant, shared with the CPU kernel, and the qparams are read and converted
// exactly as the CPU reads them (through f64), so the two backends agree bit for bit. Bad
// qparams (scale <= 0 or non-finite, zero point outside the range) are recorded in the
// device error buffer and raised at the end of the run; the fake_quant_enabled flag is read
// on the device (no host synchronisation).
//
// The kernel is memory-bound only if the per-element work stays small, so the qparam lookup
// is specialised by layout: per tensor the qparams are loaded, validated and inverted once
// per thread; when every pack of 8 shares one qparam (per channel with inner % 8 == 0,
// per token with rows % 8 == 0, groups of a multiple of 8 along the last axis) once per
// pack; otherwise per element, with the result cached while the index repeats. Index
// arithmetic is 32-bit below 2^31 elements, blocks stream contiguous runs of packs, and the
// element math is written with selects (fake_quant_select) so the 8 elements of a pack
// interleave instead of each sitting behind its own NaN branch.
#include "core/graph.h"
#include "ops/common/cuda_vec.cuh"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/fake_quantize/fake_quant_pack16.cuh"

namespace qg {
namespace {

using namespace cuda;

enum class QLayout { tensor, pack, element };

struct FqArgs {
  ScopeDims scope;
  double qmin, qmax;
  float qmin_f, qmax_f;  // qmin, qmax rounded to f32 (exact: both are int32 values)
  bool small_range;      // |qmin|, |qmax| <= 2^23 (every range of 2..16 bits)
  int64_t n;
  bool vec;                // x and y are 16-byte aligned
  const uint8_t* enabled;  // fake_quant_enabled state, or null (always on)
  DeviceErrorRecord* err;
  int32_t node;
};

// lo, hi: qmin - zp and qmax - zp (for fake_quant_pack16). tame: the conditions under
// which fake_quant_pack16 is exact for every non-NaN x: scale and 1/scale finite and
// non-zero in the math type (the f64 -> f32 conversion can still make them 0 or Inf), a
// valid zero point and a small range (so lo and hi are exact).
template <typename M>
struct QParam {
  M scale, inv, zp, lo, hi;
  bool tame;
};

// The qparams of index qi, validated (errors recorded with the same code, index and value
// as before) and converted through f64 as the CPU converts them.
template <typename M, typename S, typename Z, typename I>
__device__ __forceinline__ QParam<M> load_qparam(const S* scale, const Z* zp, I qi,
                                                 const FqArgs& a) {
  double s = static_cast<double>(scale[qi]), z = static_cast<double>(zp[qi]);
  if (!(qmath::is_finite(s) && s > 0))
    report_device_error(a.err, kBadScale, a.node, static_cast<int64_t>(qi), s);
  const bool zp_ok = z >= a.qmin && z <= a.qmax;
  if (!zp_ok)
    report_device_error(a.err, kBadZeroPoint, a.node, static_cast<int64_t>(qi), z, a.qmin, a.qmax);
  const M sm = static_cast<M>(s), inv = M(1) / sm, zm = static_cast<M>(z);
  const bool tame = a.small_range && zp_ok && qmath::is_finite(sm) && sm != M(0) &&
                    qmath::is_finite(inv) && inv != M(0);
  return {sm, inv, zm, static_cast<M>(a.qmin) - zm, static_cast<M>(a.qmax) - zm, tame};
}

// qmath::fake_quant with selects instead of the early NaN return, bit for bit the same:
// a NaN x gives a NaN q, which fails both range tests (mask 0) and passes through both
// clamp selects; y is then replaced by x itself, as fake_quant returns it.
template <typename M>
__device__ __forceinline__ qmath::FakeQuantResult<M> fake_quant_select(M x, M inv, M scale, M zp,
                                                                       M qmin, M qmax) {
  const M q = qmath::round_even(x * inv) + zp;
  const bool in_range = (q >= qmin) & (q <= qmax);
  M c = q < qmin ? qmin : q;
  c = c > qmax ? qmax : c;
  const M y = (c - zp) * scale;
  return {qmath::is_nan(x) ? x : y, in_range};
}

template <typename T, typename S, typename Z, typename I, QLayout L>
__global__ void __launch_bounds__(kPackThreads)
    fake_quantize_kernel(const T* __restrict__ x, const S* __restrict__ scale,
                         const Z* __restrict__ zp, T* __restrict__ y, uint8_t* __restrict__ mask,
                         FqArgs a) {
  using M = math_of<T>;
  constexpr int U = kPacksPerThread<T>;
  // From the f32 copies when M is f32: the same values as converting the doubles here, but
  // read from the constant bank instead of converted again for every pack.
  const M qmin = std::is_same_v<M, float> ? a.qmin_f : static_cast<M>(a.qmin);
  const M qmax = std::is_same_v<M, float> ? a.qmax_f : static_cast<M>(a.qmax);
  const bool on = a.enabled == nullptr || *a.enabled != 0;
  const I n = static_cast<I>(a.n), nfull = n / 8;
  auto cache = last_qparam<QParam<M>, I>([=](I qi) { return load_qparam<M>(scale, zp, qi, a); });
  if (L == QLayout::tensor && on) cache.get(0);
  // The NaN-test operand of a 16-bit pack (see no_nan_in): once per thread for one qparam.
  uint32_t poison = 0;
  if constexpr (sizeof(T) == 2)
    if (L == QLayout::tensor) poison = cache.p.tame ? kPairNegInf<T> : kPairNaN<T>;
  auto element = [&](T xv, const QParam<M>& p, unsigned& bit) {
    auto r = fake_quant_select<M>(to_math(xv), p.inv, p.scale, p.zp, qmin, qmax);
    bit = r.in_range ? 1u : 0u;
    return from_math_select<T>(r.y);
  };
  auto load = [&](I b) { return load_pack(x, b, a.vec); };
  constexpr bool unroll = !(sizeof(T) == 2 && L == QLayout::pack);
  flat_packs<U, unroll>(nfull, load, [&](I b, const Pack8<T>& xv) {
    Pack8<T> yv;
    unsigned bits = 0xffu;
    if (!on) {
      // Disabled: identity with every mask bit set (as the CPU kernel).
      yv = xv;
    } else {
      if (L == QLayout::pack) cache.get(qparam_index_of<I>(a.scope, b * 8));
      bool done = false;
      if constexpr (sizeof(T) == 2 && L != QLayout::element) {
        // 16-bit types, one qparam per pack: the packed form, exact for packs without NaN
        // under tame qparams (fake_quant_pack16.cuh); a NaN is rare, so this branch is
        // almost never taken and is the same for the whole warp.
        const QParam<M>& p = cache.p;
        fake_quant_pack16<T>(xv, p.inv, p.scale, p.lo, p.hi, yv, bits);
        if (L == QLayout::pack) poison = p.tame ? kPairNegInf<T> : kPairNaN<T>;
        done = no_nan_in(xv, poison);
      }
      if (__builtin_expect(!done, 0)) {
        bits = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (L == QLayout::element) cache.get(qparam_index_of<I>(a.scope, b * 8 + j));
          unsigned bit;
          yv.v[j] = element(xv.v[j], cache.p, bit);
          bits |= bit << j;
        }
      }
    }
    store_pack(y, b, a.vec, yv);
    mask[b] = static_cast<uint8_t>(bits);
  });
  // The last, partial mask byte (n % 8 elements): one thread, element by element.
  if (blockIdx.x == 0 && threadIdx.x == 0 && nfull * 8 < n) {
    unsigned bits = 0;
    for (I k = nfull * 8; k < n; ++k) {
      const int j = static_cast<int>(k - nfull * 8);
      if (!on) {
        y[k] = x[k];
        bits |= 1u << j;
        continue;
      }
      unsigned bit;
      y[k] = element(x[k], cache.get(qparam_index_of<I>(a.scope, k)), bit);
      bits |= bit << j;
    }
    mask[nfull] = static_cast<uint8_t>(bits);
  }
}

template <typename T, typename S, typename Z>
void launch_fake_quantize(const Tensor& x, const Tensor& scale, const Tensor& zp, Tensor& y,
                          Tensor& mask, const FqArgs& a, cudaStream_t s) {
  const T* px = in_ptr<T>(x);
  const S* ps = in_ptr<S>(scale);
  const Z* pz = in_ptr<Z>(zp);
  T* py = out_ptr<T>(y);
  uint8_t* pm = out_ptr<uint8_t>(mask);
  const unsigned grid = pack_blocks<kPacksPerThread<T>>(a.n / 8);
  auto go = [&](auto kernel) { kernel<<<grid, kPackThreads, 0, s>>>(px, ps, pz, py, pm, a); };
  dispatch_index(a.n, [&](auto itag) {
    using I = decltype(itag);
    if constexpr (std::is_same_v<I, uint32_t>) {
      if (a.scope.kind == ScopeKind::tensor)
        return go(fake_quantize_kernel<T, S, Z, I, QLayout::tensor>);
      if (runs_share_qparam(a.scope, 8)) return go(fake_quantize_kernel<T, S, Z, I, QLayout::pack>);
    }
    go(fake_quantize_kernel<T, S, Z, I, QLayout::element>);
  });
}

void fake_quantize_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& scale = ctx.inputs[1];
  const Tensor& zp = ctx.inputs[2];
  Tensor& y = ctx.outputs[0];
  if (x.numel() == 0) return;
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  FqArgs a{scope_dims(l),
           static_cast<double>(r.qmin),
           static_cast<double>(r.qmax),
           static_cast<float>(static_cast<double>(r.qmin)),
           static_cast<float>(static_cast<double>(r.qmax)),
           std::abs(r.qmin) <= (int64_t{1} << 23) && std::abs(r.qmax) <= (int64_t{1} << 23),
           x.numel(),
           aligned16(x.raw_data()) && aligned16(y.raw_data()),
           ctx.states.empty() ? nullptr : in_ptr<uint8_t>(ctx.states[0]),
           error_record(ctx.device),
           ctx.site};
  auto s = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    bool s64 = scale.dtype() == DType::f64, z64 = zp.dtype() == DType::i64;
    if (s64 && z64) launch_fake_quantize<T, double, int64_t>(x, scale, zp, y, ctx.outputs[1], a, s);
    if (s64 && !z64)
      launch_fake_quantize<T, double, int32_t>(x, scale, zp, y, ctx.outputs[1], a, s);
    if (!s64 && z64) launch_fake_quantize<T, float, int64_t>(x, scale, zp, y, ctx.outputs[1], a, s);
    if (!s64 && !z64)
      launch_fake_quantize<T, float, int32_t>(x, scale, zp, y, ctx.outputs[1], a, s);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

// ste_backward: dx = dy where the mask bit is set, else +0; dy is copied bit for bit.
// kExact (ste_backward_exact): else dy * 0, PyTorch's dy * mask.
template <bool kExact, typename T, typename I>
__global__ void __launch_bounds__(kPackThreads)
    ste_backward_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ mask,
                        T* __restrict__ dx, int64_t n64, bool vec) {
  const I n = static_cast<I>(n64), nfull = n / 8;
  const T zero = from_math<T>(0);
  struct In {
    Pack8<T> v;
    unsigned bits;
  };
  auto load = [&](I b) { return In{load_pack(dy, b, vec), mask[b]}; };
  flat_packs<kPacksPerThread<T>>(nfull, load, [&](I b, const In& in) {
    store_pack(dx, b, vec, kExact ? exact_masked_pack(in.v, in.bits) : masked_pack(in.v, in.bits));
  });
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k) {
      const bool keep = (mask[nfull] >> (k - nfull * 8)) & 1u;
      dx[k] = keep ? dy[k] : kExact ? from_math<T>(to_math(dy[k]) * math_of<T>(0)) : zero;
    }
}

template <bool kExact>
void ste_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  Tensor& dx = ctx.outputs[0];
  int64_t n = dx.numel();
  if (n == 0) return;
  bool vec = aligned16(dy.raw_data()) && aligned16(dx.raw_data());
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(n, [&](auto itag) {
      ste_backward_kernel<kExact, T, decltype(itag)>
          <<<pack_blocks<kPacksPerThread<T>>(n / 8), kPackThreads, 0, cuda_stream(ctx.device)>>>(
              in_ptr<T>(dy), in_ptr<uint8_t>(ctx.inputs[1]), out_ptr<T>(dx), n, vec);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_fake_quantize_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fake_quantize")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, fake_quantize_cuda});
  r.get_mutable("ste_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, ste_backward_cuda<false>});
  r.get_mutable("ste_backward_exact")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, ste_backward_cuda<true>});
}

}  // namespace qg
