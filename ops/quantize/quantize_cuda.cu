// CUDA kernels for quantize, quantize_backward, dequantize and dequantize_backward. The
// element math is ops/quantize/quantize_math.h, shared with the CPU kernels, and qparams are
// read through f64 as the CPU reads them, so codes, masks and values are bit-identical. One
// thread owns one mask byte in quantize (with one qparam load per byte where the scope allows:
// quantize_runs_kernel). dequantize_backward's dscale is a deterministic f64
// sum per qparam (blocks over fixed stretches, then the stretches in order). Bad qparams are
// recorded in the device error buffer and raised at the end of the run.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/quantize/quantize_cpu.h"
#include "ops/quantize/quantize_math.h"

namespace qg {
namespace {

using namespace cuda;

struct QArgs {
  ScopeDims d;
  double qmin, qmax;  // the range zero points are checked against (and codes clamp to)
  int64_t n;
  DeviceErrorRecord* err;
  int32_t node;
};

// scale (and zero point, when given) of q, validated, in the math type.
template <typename M, typename S, typename Z>
__device__ __forceinline__ void qparams_of(const S* scale, const Z* zp, int64_t q, const QArgs& a,
                                           M& sm, M& zm) {
  double s = static_cast<double>(scale[q]);
  if (!(qmath::is_finite(s) && s > 0)) report_device_error(a.err, kBadScale, a.node, q, s);
  sm = static_cast<M>(s);
  zm = M(0);
  if (zp != nullptr) {
    double z = static_cast<double>(zp[q]);
    if (!(z >= a.qmin && z <= a.qmax))
      report_device_error(a.err, kBadZeroPoint, a.node, q, z, a.qmin, a.qmax);
    zm = static_cast<M>(z);
  }
}

template <typename T, typename Q, typename S, typename Z>
__global__ void quantize_kernel(const T* x, const S* scale, const Z* zp, Q* out, uint8_t* mask,
                                QArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  for (int64_t b = global_thread(); b < (a.n + 7) / 8; b += global_stride()) {
    int64_t k0 = b * 8;
    int cnt = a.n - k0 < 8 ? static_cast<int>(a.n - k0) : 8;
    uint8_t bits = 0;
    for (int j = 0; j < cnt; ++j) {
      int64_t q = qparam_of(a.d, k0 + j);
      M sm, zm;
      qparams_of<M>(scale, zp, q, a, sm, zm);
      qstore::Code c = qstore::quantize<M>(to_math(x[k0 + j]), M(1) / sm, zm, qmin, qmax);
      out[k0 + j] = static_cast<Q>(c.q);
      bits |= static_cast<uint8_t>(c.in_range) << j;
    }
    mask[b] = bits;
  }
}

// The same codes and mask where every run of 8 elements (one mask byte) shares one qparam
// (host: quantize_runs_of_8): the qparam index, its validation and 1 / scale are computed once
// per byte instead of once per element (the per-element path's 64-bit divisions dominate it),
// the 8 elements arrive in 16-byte loads and the 8 codes leave in one 8-byte store.
template <typename T, typename Q, typename S, typename Z>
__global__ void quantize_runs_kernel(const T* x, const S* scale, const Z* zp, Q* out, uint8_t* mask,
                                     QArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  for (int64_t b = global_thread(); b < a.n / 8; b += global_stride()) {
    M sm, zm;
    qparams_of<M>(scale, zp, qparam_of(a.d, b * 8), a, sm, zm);
    const M inv = M(1) / sm;
    T v[8];
    static_assert(sizeof(v) % 16 == 0, "8 elements fill whole 16-byte loads");
    for (int j = 0; j < static_cast<int>(sizeof(v) / 16); ++j)
      reinterpret_cast<uint4*>(v)[j] = reinterpret_cast<const uint4*>(x + b * 8)[j];
    Q codes[8];
    uint8_t bits = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      qstore::Code c = qstore::quantize<M>(to_math(v[j]), inv, zm, qmin, qmax);
      codes[j] = static_cast<Q>(c.q);
      bits |= static_cast<uint8_t>(c.in_range) << j;
    }
    reinterpret_cast<uint2*>(out)[b] = *reinterpret_cast<const uint2*>(codes);
    mask[b] = bits;
  }
}

// dy (dtype D) is first rounded to dx's dtype T, as the CPU casts it, then
// dx = dy / scale where the mask bit is set.
template <typename D, typename T, typename S>
__global__ void quantize_backward_kernel(const D* dy, const uint8_t* mask, const S* scale, T* dx,
                                         QArgs a) {
  using M = math_of<T>;
  for (int64_t k = global_thread(); k < a.n; k += global_stride()) {
    M sm, zm;
    qparams_of<M, S, int32_t>(scale, nullptr, qparam_of(a.d, k), a, sm, zm);
    T d = from_math<T>(static_cast<M>(to_math(dy[k])));
    dx[k] = from_math<T>(qstore::quantize_grad<M>(to_math(d), sm, (mask[k >> 3] >> (k & 7)) & 1));
  }
}

template <typename Q, typename T, typename S, typename Z>
__global__ void dequantize_kernel(const Q* qv, const S* scale, const Z* zp, T* y, QArgs a) {
  using M = math_of<T>;
  for (int64_t k = global_thread(); k < a.n; k += global_stride()) {
    M sm, zm;
    qparams_of<M>(scale, zp, qparam_of(a.d, k), a, sm, zm);
    y[k] = from_math<T>(qstore::dequantize<M>(static_cast<int32_t>(qv[k]), sm, zm));
  }
}

struct DqArgs {
  QArgs q;
  int64_t per_q, splits, chunk;
};

// Block (q, s): dq for stretch s of q's elements and that stretch's f64 sum of dy * (q - zp).
template <typename T, typename Q, typename S, typename Z>
__global__ void dequantize_backward_kernel(const T* dy, const Q* qv, const S* scale, const Z* zp,
                                           T* dq, double* partial, DqArgs a) {
  using M = math_of<T>;
  for (int64_t b = blockIdx.x; b < a.q.d.num_qparams * a.splits; b += gridDim.x) {
    int64_t q = b / a.splits, s = b % a.splits;
    int64_t lo = s * a.chunk, hi = lo + a.chunk < a.per_q ? lo + a.chunk : a.per_q;
    M sm, zm;
    qparams_of<M>(scale, zp, q, a.q, sm, zm);
    double acc = 0;
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
      int64_t k;
      if (!scope_element(a.q.d, q, r, k)) break;
      M d = to_math(dy[k]);
      dq[k] = from_math<T>(d * sm);
      acc += static_cast<double>(d) * (static_cast<double>(qv[k]) - static_cast<double>(zm));
    }
    double total = block_reduce(acc, SumOp{});
    if (threadIdx.x == 0) partial[b] = total;
  }
}

template <typename G>
__global__ void dscale_finish_kernel(const double* partial, int64_t nq, int64_t splits, G* ds) {
  for (int64_t q = global_thread(); q < nq; q += global_stride()) {
    double acc = 0;
    for (int64_t s = 0; s < splits; ++s) acc += partial[q * splits + s];
    ds[q] = static_cast<G>(acc);
  }
}

QArgs make_args(const KernelContext& ctx, const Shape& shape, const QuantRange& r) {
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  return {scope_dims(l),      static_cast<double>(r.qmin), static_cast<double>(r.qmax),
          shape_numel(shape), error_record(ctx.device),    ctx.site};
}

template <typename Fn>
void dispatch_scale(const Tensor& t, Fn&& fn) {
  if (t.dtype() == DType::f64)
    fn(double{});
  else
    fn(float{});
}
template <typename Fn>
void dispatch_zp(const Tensor& t, Fn&& fn) {
  if (t.dtype() == DType::i64)
    fn(int64_t{});
  else
    fn(int32_t{});
}
template <typename Fn>
void dispatch_storage(const Tensor& t, Fn&& fn) {
  if (t.dtype() == DType::i8)
    fn(int8_t{});
  else
    fn(uint8_t{});
}

#define QG_LAUNCH_ARGS(n) elementwise_launch(n).blocks, elementwise_launch(n).threads, 0, stream

// Whether every mask byte's 8 elements share one qparam: the elements of one qparam lie in
// contiguous runs whose length is a multiple of 8 (a channel's inner extent, a token's row, a
// whole group along the last axis), and the tensor splits into whole bytes.
bool quantize_runs_of_8(const ScopeDims& d, int64_t n) {
  if (n % 8 != 0) return false;
  switch (d.kind) {
    case ScopeKind::tensor:
      return true;
    case ScopeKind::channel:
      return d.inner % 8 == 0;
    case ScopeKind::token:
      return (d.axis_len * d.inner) % 8 == 0;
    case ScopeKind::group:
      return d.inner == 1 && d.axis_len % d.group_size == 0 && d.group_size % 8 == 0;
  }
  return false;
}

void quantize_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.numel() == 0) return;
  QArgs a = make_args(ctx, x.shape(), ctx.args<QuantScopeArgs>().range);
  auto stream = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto t) {
    dispatch_storage(ctx.outputs[0], [&](auto q) {
      dispatch_scale(ctx.inputs[1], [&](auto s) {
        dispatch_zp(ctx.inputs[2], [&](auto z) {
          using T = decltype(t);
          using Q = decltype(q);
          using S = decltype(s);
          using Z = decltype(z);
          if (quantize_runs_of_8(a.d, a.n))
            quantize_runs_kernel<T, Q, S, Z><<<QG_LAUNCH_ARGS(a.n / 8)>>>(
                in_ptr<T>(x), in_ptr<S>(ctx.inputs[1]), in_ptr<Z>(ctx.inputs[2]),
                out_ptr<Q>(ctx.outputs[0]), out_ptr<uint8_t>(ctx.outputs[1]), a);
          else
            quantize_kernel<T, Q, S, Z><<<QG_LAUNCH_ARGS((x.numel() + 7) / 8)>>>(
                in_ptr<T>(x), in_ptr<S>(ctx.inputs[1]), in_ptr<Z>(ctx.inputs[2]),
                out_ptr<Q>(ctx.outputs[0]), out_ptr<uint8_t>(ctx.outputs[1]), a);
        });
      });
    });
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void quantize_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  Tensor& dx = ctx.outputs[0];
  if (dx.numel() == 0) return;
  QArgs a = make_args(ctx, dy.shape(), QuantRange{});
  auto stream = cuda_stream(ctx.device);
  dispatch_float(dy.dtype(), ctx.op, [&](auto d) {
    dispatch_float(dx.dtype(), ctx.op, [&](auto t) {
      dispatch_scale(ctx.inputs[2], [&](auto s) {
        using D = decltype(d);
        using T = decltype(t);
        using S = decltype(s);
        quantize_backward_kernel<D, T, S>
            <<<QG_LAUNCH_ARGS(dx.numel())>>>(in_ptr<D>(dy), in_ptr<uint8_t>(ctx.inputs[1]),
                                             in_ptr<S>(ctx.inputs[2]), out_ptr<T>(dx), a);
      });
    });
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void dequantize_cuda(KernelContext& ctx) {
  const Tensor& q = ctx.inputs[0];
  if (q.numel() == 0) return;
  QArgs a = make_args(ctx, q.shape(), storage_range(q.dtype()));
  auto stream = cuda_stream(ctx.device);
  dispatch_storage(q, [&](auto qt) {
    dispatch_float(ctx.outputs[0].dtype(), ctx.op, [&](auto t) {
      dispatch_scale(ctx.inputs[1], [&](auto s) {
        dispatch_zp(ctx.inputs[2], [&](auto z) {
          using Q = decltype(qt);
          using T = decltype(t);
          using S = decltype(s);
          using Z = decltype(z);
          dequantize_kernel<Q, T, S, Z><<<QG_LAUNCH_ARGS(q.numel())>>>(
              in_ptr<Q>(q), in_ptr<S>(ctx.inputs[1]), in_ptr<Z>(ctx.inputs[2]),
              out_ptr<T>(ctx.outputs[0]), a);
        });
      });
    });
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void dequantize_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& q = ctx.inputs[1];
  DqArgs a{make_args(ctx, q.shape(), storage_range(q.dtype())), 0, 1, 1};
  a.per_q = elements_per_qparam(a.q.d);
  a.splits = reduction_splits(a.q.d.num_qparams, a.per_q, 256);
  a.chunk = a.per_q == 0 ? 1 : (a.per_q + a.splits - 1) / a.splits;
  int64_t nq = a.q.d.num_qparams;
  Tensor partial = Tensor::empty({nq * a.splits}, DType::f64, dy.device());
  int64_t blocks = nq * a.splits;
  unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  auto stream = cuda_stream(ctx.device);
  dispatch_float(dy.dtype(), ctx.op, [&](auto t) {
    dispatch_storage(q, [&](auto qt) {
      dispatch_scale(ctx.inputs[2], [&](auto s) {
        dispatch_zp(ctx.inputs[3], [&](auto z) {
          using T = decltype(t);
          using Q = decltype(qt);
          using S = decltype(s);
          using Z = decltype(z);
          dequantize_backward_kernel<T, Q, S, Z><<<grid, 256, 0, stream>>>(
              in_ptr<T>(dy), in_ptr<Q>(q), in_ptr<S>(ctx.inputs[2]), in_ptr<Z>(ctx.inputs[3]),
              out_ptr<T>(ctx.outputs[0]), out_ptr<double>(partial), a);
        });
      });
    });
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  dispatch_scale(ctx.outputs[1], [&](auto g) {
    using G = decltype(g);
    dscale_finish_kernel<G>
        <<<QG_LAUNCH_ARGS(nq)>>>(in_ptr<double>(partial), nq, a.splits, out_ptr<G>(ctx.outputs[1]));
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_quantize_cuda_kernels(OpRegistry& r) {
  r.get_mutable("quantize").kernels.push_back({DeviceType::cuda, kFloatDTypes, quantize_cuda});
  r.get_mutable("quantize_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, quantize_backward_cuda});
  r.get_mutable("dequantize")
      .kernels.push_back({DeviceType::cuda, {DType::i8, DType::u8}, dequantize_cuda});
  r.get_mutable("dequantize_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, dequantize_backward_cuda});
}

}  // namespace qg
