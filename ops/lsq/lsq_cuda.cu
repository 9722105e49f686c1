// CUDA kernels for lsq_fake_quantize and lsq_backward. The element math is the shared
// qmath::fake_quant / lsq::element_grad, with qparams read through f64 exactly as the CPU
// reads them, so y and dx are bit-identical to the CPU. The scale and zero-point gradients
// are sums over each qparam's elements in f64: blocks reduce fixed stretches (deterministic
// tree), one thread per qparam adds the stretches in order and applies grad_factor once.
// Bad qparams are recorded in the device error buffer and raised at the end of the run.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/lsq/lsq_cpu.h"
#include "ops/lsq/lsq_math.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

struct LsqArgs {
  ScopeDims d;
  double qmin, qmax;
  int64_t n, per_q, splits, chunk;
  DeviceErrorRecord* err;
  int32_t node;
};

// The qparams of q as the CPU derives them: validated, converted to M, zp rounded and clamped.
template <typename M, typename S, typename Z>
__device__ __forceinline__ void load_qparams(const S* scale, const Z* zp, int64_t q,
                                             const LsqArgs& a, M& sm, M& inv, M& zi) {
  double s = static_cast<double>(scale[q]), z = static_cast<double>(zp[q]);
  if (!(qmath::is_finite(s) && s > 0)) report_device_error(a.err, kBadScale, a.node, q, s);
  if (!qmath::is_finite(z)) report_device_error(a.err, kNonFiniteZeroPoint, a.node, q, z);
  sm = static_cast<M>(s);
  inv = M(1) / sm;
  zi = lsq::zero_point_int<M>(static_cast<M>(z), static_cast<M>(a.qmin), static_cast<M>(a.qmax));
}

template <typename T, typename S, typename Z>
__global__ void lsq_forward_kernel(const T* x, const S* scale, const Z* zp, T* y, LsqArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  for (int64_t k = global_thread(); k < a.n; k += global_stride()) {
    int64_t q = qparam_of(a.d, k);
    M sm, inv, zi;
    load_qparams<M>(scale, zp, q, a, sm, inv, zi);
    y[k] = from_math<T>(qmath::fake_quant<M>(to_math(x[k]), inv, sm, zi, qmin, qmax).y);
  }
}

struct Sums {
  double dscale, dzp;
};
struct AddSums {
  __device__ Sums operator()(Sums a, Sums b) const { return {a.dscale + b.dscale, a.dzp + b.dzp}; }
};

// Block (q, s): dx for stretch s of q's elements, and that stretch's gradient sums.
template <typename T, typename S, typename Z>
__global__ void lsq_backward_kernel(const T* dy, const T* x, const S* scale, const Z* zp, T* dx,
                                    Sums* partial, LsqArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  for (int64_t b = blockIdx.x; b < a.d.num_qparams * a.splits; b += gridDim.x) {
    int64_t q = b / a.splits, s = b % a.splits;
    int64_t lo = s * a.chunk, hi = lo + a.chunk < a.per_q ? lo + a.chunk : a.per_q;
    M sm, inv, zi;
    load_qparams<M>(scale, zp, q, a, sm, inv, zi);
    Sums acc{0, 0};
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
      int64_t k;
      if (!scope_element(a.d, q, r, k)) break;
      auto e = lsq::element_grad<M>(to_math(x[k]), to_math(dy[k]), inv, sm, zi, qmin, qmax);
      dx[k] = from_math<T>(e.dx);
      acc.dscale += static_cast<double>(e.dscale);
      acc.dzp += static_cast<double>(e.dzp);
    }
    Sums total = block_reduce(acc, AddSums{});
    if (threadIdx.x == 0) partial[b] = total;
  }
}

template <typename GS, typename GZ>
__global__ void lsq_finish_kernel(const Sums* partial, int64_t nq, int64_t splits, double g,
                                  GS* dscale, GZ* dzp) {
  for (int64_t q = global_thread(); q < nq; q += global_stride()) {
    Sums acc{0, 0};
    for (int64_t s = 0; s < splits; ++s) acc = AddSums{}(acc, partial[q * splits + s]);
    dscale[q] = static_cast<GS>(g * acc.dscale);
    dzp[q] = static_cast<GZ>(g * acc.dzp);
  }
}

LsqArgs make_args(const KernelContext& ctx, const Tensor& x) {
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, x.shape());
  LsqArgs a{scope_dims(l),
            static_cast<double>(r.qmin),
            static_cast<double>(r.qmax),
            x.numel(),
            0,
            1,
            1,
            device_error_record(),
            ctx.node.id};
  a.per_q = elements_per_qparam(a.d);
  a.splits = reduction_splits(a.d.num_qparams, a.per_q, kThreads);
  a.chunk = a.per_q == 0 ? 1 : (a.per_q + a.splits - 1) / a.splits;
  return a;
}

// Calls fn(S{}, Z{}) with the C++ types of the (f32 | f64) scale and zero point.
template <typename Fn>
void dispatch_qparams(const Tensor& scale, const Tensor& zp, Fn&& fn) {
  bool s64 = scale.dtype() == DType::f64, z64 = zp.dtype() == DType::f64;
  if (s64 && z64) fn(double{}, double{});
  if (s64 && !z64) fn(double{}, float{});
  if (!s64 && z64) fn(float{}, double{});
  if (!s64 && !z64) fn(float{}, float{});
}

void lsq_forward_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.numel() == 0) return;
  LsqArgs a = make_args(ctx, x);
  auto shape = elementwise_launch(x.numel());
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_qparams(ctx.inputs[1], ctx.inputs[2], [&](auto stag, auto ztag) {
      using S = decltype(stag);
      using Z = decltype(ztag);
      lsq_forward_kernel<T, S, Z>
          <<<shape.blocks, shape.threads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
              in_ptr<T>(x), in_ptr<S>(ctx.inputs[1]), in_ptr<Z>(ctx.inputs[2]),
              out_ptr<T>(ctx.outputs[0]), a);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void lsq_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& x = ctx.inputs[1];
  LsqArgs a = make_args(ctx, x);
  double g = lsq_grad_factor(ctx.op, ctx.attrs, x.numel());
  auto s = static_cast<cudaStream_t>(ctx.stream);
  int64_t nq = a.d.num_qparams;
  Tensor partial =
      Tensor::empty({nq * a.splits * static_cast<int64_t>(sizeof(Sums))}, DType::u8, x.device());
  int64_t blocks = nq * a.splits;
  unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_qparams(ctx.inputs[2], ctx.inputs[3], [&](auto stag, auto ztag) {
      using S = decltype(stag);
      using Z = decltype(ztag);
      lsq_backward_kernel<T, S, Z><<<grid, kThreads, 0, s>>>(
          in_ptr<T>(dy), in_ptr<T>(x), in_ptr<S>(ctx.inputs[2]), in_ptr<Z>(ctx.inputs[3]),
          out_ptr<T>(ctx.outputs[0]), out_ptr<Sums>(partial), a);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
  auto shape = elementwise_launch(nq);
  // dscale takes scale's dtype and dzero_point zero_point's (as the CPU stores them).
  dispatch_qparams(ctx.outputs[1], ctx.outputs[2], [&](auto gs, auto gz) {
    using GS = decltype(gs);
    using GZ = decltype(gz);
    lsq_finish_kernel<GS, GZ><<<shape.blocks, shape.threads, 0, s>>>(
        in_ptr<Sums>(partial), nq, a.splits, g, out_ptr<GS>(ctx.outputs[1]),
        out_ptr<GZ>(ctx.outputs[2]));
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

const std::vector<DType> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

void add_lsq_cuda_kernels(OpRegistry& r) {
  r.get_mutable("lsq_fake_quantize")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, lsq_forward_cuda});
  r.get_mutable("lsq_backward")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, lsq_backward_cuda});
}

}  // namespace qg
