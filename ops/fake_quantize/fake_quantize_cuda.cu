// CUDA kernels for fake_quantize and ste_backward. One thread owns one mask byte (8
// elements), so the bit-packed mask is written without atomics; the 8 elements travel as
// 16-byte packs. The element math is qmath::fake_quant, shared with the CPU kernel, and the
// qparams are read and converted exactly as the CPU reads them (through f64), so the two
// backends agree bit for bit. Bad qparams (scale <= 0 or non-finite, zero point outside the
// range) are recorded in the device error buffer and raised at the end of the run; the
// fake_quant_enabled flag is read on the device (no host synchronisation).
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_attrs.h"

namespace qg {
namespace {

using namespace cuda;

struct FqArgs {
  ScopeDims scope;
  double qmin, qmax;
  int64_t n;
  bool vec;                // x and y are 16-byte aligned
  const uint8_t* enabled;  // fake_quant_enabled state, or null (always on)
  DeviceErrorRecord* err;
  int32_t node;
};

template <typename T>
__device__ __forceinline__ void load8(const T* p, int64_t k0, int cnt, bool vec, T (&v)[8]) {
  if (cnt == 8 && vec) {
    Pack<T, 8> pk = *reinterpret_cast<const Pack<T, 8>*>(p + k0);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = pk.v[j];
  } else {
    for (int j = 0; j < cnt; ++j) v[j] = p[k0 + j];
  }
}

template <typename T>
__device__ __forceinline__ void store8(T* p, int64_t k0, int cnt, bool vec, const T (&v)[8]) {
  if (cnt == 8 && vec) {
    Pack<T, 8> pk;
#pragma unroll
    for (int j = 0; j < 8; ++j) pk.v[j] = v[j];
    *reinterpret_cast<Pack<T, 8>*>(p + k0) = pk;
  } else {
    for (int j = 0; j < cnt; ++j) p[k0 + j] = v[j];
  }
}

template <typename T, typename S, typename Z>
__global__ void fake_quantize_kernel(const T* x, const S* scale, const Z* zp, T* y, uint8_t* mask,
                                     FqArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  const bool on = a.enabled == nullptr || *a.enabled != 0;
  const int64_t nbytes = (a.n + 7) / 8;
  int64_t cached_qi = -1;
  M sm = M(1), inv = M(1), zm = M(0);
  for (int64_t b = global_thread(); b < nbytes; b += global_stride()) {
    int64_t k0 = b * 8;
    int cnt = a.n - k0 < 8 ? static_cast<int>(a.n - k0) : 8;
    T xv[8], yv[8];
    load8(x, k0, cnt, a.vec, xv);
    uint8_t bits = 0;
    if (!on) {
      // Disabled: identity with every mask bit of a real element set (as the CPU kernel).
      for (int j = 0; j < cnt; ++j) yv[j] = xv[j];
      bits = static_cast<uint8_t>((1u << cnt) - 1u);
    } else {
      for (int j = 0; j < cnt; ++j) {
        int64_t qi = qparam_of(a.scope, k0 + j);
        // Neighbouring elements mostly share their qparams (always, per tensor): load,
        // validate and invert them only when the index changes.
        if (qi != cached_qi) {
          double s = static_cast<double>(scale[qi]), z = static_cast<double>(zp[qi]);
          if (!(qmath::is_finite(s) && s > 0)) report_device_error(a.err, kBadScale, a.node, qi, s);
          if (!(z >= a.qmin && z <= a.qmax))
            report_device_error(a.err, kBadZeroPoint, a.node, qi, z, a.qmin, a.qmax);
          sm = static_cast<M>(s);
          inv = M(1) / sm;
          zm = static_cast<M>(z);
          cached_qi = qi;
        }
        auto r = qmath::fake_quant<M>(to_math(xv[j]), inv, sm, zm, qmin, qmax);
        yv[j] = from_math<T>(r.y);
        bits |= static_cast<uint8_t>(r.in_range) << j;
      }
    }
    store8(y, k0, cnt, a.vec, yv);
    mask[b] = bits;
  }
}

void fake_quantize_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& scale = ctx.inputs[1];
  const Tensor& zp = ctx.inputs[2];
  Tensor& y = ctx.outputs[0];
  if (x.numel() == 0) return;
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, x.shape());
  FqArgs a{scope_dims(l),
           static_cast<double>(r.qmin),
           static_cast<double>(r.qmax),
           x.numel(),
           aligned16(x.raw_data()) && aligned16(y.raw_data()),
           ctx.states.empty() ? nullptr : in_ptr<uint8_t>(ctx.states[0]),
           device_error_record(),
           ctx.node.id};
  auto shape = elementwise_launch((x.numel() + 7) / 8);
  auto s = static_cast<cudaStream_t>(ctx.stream);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto stag, auto ztag) {
      using S = decltype(stag);
      using Z = decltype(ztag);
      fake_quantize_kernel<T, S, Z><<<shape.blocks, shape.threads, 0, s>>>(
          in_ptr<T>(x), in_ptr<S>(scale), in_ptr<Z>(zp), out_ptr<T>(y),
          out_ptr<uint8_t>(ctx.outputs[1]), a);
    };
    bool s64 = scale.dtype() == DType::f64, z64 = zp.dtype() == DType::i64;
    if (s64 && z64) launch(double{}, int64_t{});
    if (s64 && !z64) launch(double{}, int32_t{});
    if (!s64 && z64) launch(float{}, int64_t{});
    if (!s64 && !z64) launch(float{}, int32_t{});
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

// dx = dy where the mask bit is set, else +0; dy is copied bit for bit.
template <typename T>
__global__ void ste_backward_kernel(const T* dy, const uint8_t* mask, T* dx, int64_t n, bool vec) {
  const int64_t nbytes = (n + 7) / 8;
  for (int64_t b = global_thread(); b < nbytes; b += global_stride()) {
    int64_t k0 = b * 8;
    int cnt = n - k0 < 8 ? static_cast<int>(n - k0) : 8;
    T v[8], out[8];
    load8(dy, k0, cnt, vec, v);
    uint8_t bits = mask[b];
    for (int j = 0; j < cnt; ++j) out[j] = (bits >> j) & 1u ? v[j] : from_math<T>(0);
    store8(dx, k0, cnt, vec, out);
  }
}

void ste_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  Tensor& dx = ctx.outputs[0];
  int64_t n = dx.numel();
  if (n == 0) return;
  bool vec = aligned16(dy.raw_data()) && aligned16(dx.raw_data());
  auto shape = elementwise_launch((n + 7) / 8);
  dispatch_float(dy.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    ste_backward_kernel<T>
        <<<shape.blocks, shape.threads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
            in_ptr<T>(dy), in_ptr<uint8_t>(ctx.inputs[1]), out_ptr<T>(dx), n, vec);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

const std::vector<DType> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

void add_fake_quantize_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fake_quantize")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, fake_quantize_cuda});
  r.get_mutable("ste_backward")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, ste_backward_cuda});
}

}  // namespace qg
