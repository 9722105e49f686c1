// CUDA kernel for dynamic_range_quantize, in three launches that never leave the device:
// (1) blocks reduce fixed stretches of each scope to a finite (min, max) in the math type,
// (2) one thread per scope folds its stretches and computes (scale, zero_point) with the
// shared dynq::qparams, (3) every element is quantized with qstore::quantize and its scope's
// reciprocal scale. min/max are exact (any order gives the same value; the sign of a zero
// cannot change the qparams), so codes, scales and zero points match the CPU bit for bit.
// An affine range too wide for f32 is recorded in the device error buffer, as the CPU raises.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/dynamic_quant/dynamic_quant_math.h"
#include "ops/quantize/quantize_math.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

template <typename M>
struct Range {
  M lo, hi;
};
template <typename M>
struct CombineRange {
  __device__ Range<M> operator()(Range<M> a, Range<M> b) const {
    return {b.lo < a.lo ? b.lo : a.lo, b.hi > a.hi ? b.hi : a.hi};
  }
};

struct DynArgs {
  ScopeDims d;
  int64_t n, per_q, splits, chunk;
  int32_t qmin, qmax;
  bool symmetric;
  DeviceErrorRecord* err;
  int32_t node;
};

template <typename T>
__global__ void range_partial_kernel(const T* x, Range<math_of<T>>* partial, DynArgs a) {
  using M = math_of<T>;
  for (int64_t b = blockIdx.x; b < a.d.num_qparams * a.splits; b += gridDim.x) {
    int64_t q = b / a.splits, s = b % a.splits;
    int64_t lo = s * a.chunk, hi = lo + a.chunk < a.per_q ? lo + a.chunk : a.per_q;
    Range<M> r{static_cast<M>(INFINITY), static_cast<M>(-INFINITY)};
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      int64_t k;
      if (!scope_element(a.d, q, i, k)) break;
      M v = to_math(x[k]);
      if (!qmath::is_finite(v)) continue;
      r = CombineRange<M>{}(r, Range<M>{v, v});
    }
    Range<M> total = block_reduce(r, CombineRange<M>{});
    if (threadIdx.x == 0) partial[b] = total;
  }
}

template <typename M>
__global__ void qparams_kernel(const Range<M>* partial, float* scale, int32_t* zp, M* inv, M* zpm,
                               DynArgs a) {
  for (int64_t q = global_thread(); q < a.d.num_qparams; q += global_stride()) {
    Range<M> r{static_cast<M>(INFINITY), static_cast<M>(-INFINITY)};
    for (int64_t s = 0; s < a.splits; ++s) r = CombineRange<M>{}(r, partial[q * a.splits + s]);
    dynq::QParams p = dynq::qparams(static_cast<float>(r.lo), static_cast<float>(r.hi),
                                    r.lo <= r.hi, a.symmetric, a.qmin, a.qmax);
    if (p.overflow)
      report_device_error(a.err, kAffineOverflow, a.node, q, static_cast<double>(r.hi),
                          static_cast<double>(r.lo), static_cast<double>(r.hi));
    scale[q] = p.scale;
    zp[q] = p.zero_point;
    inv[q] = M(1) / static_cast<M>(p.scale);
    zpm[q] = static_cast<M>(p.zero_point);
  }
}

template <typename T, typename Q>
__global__ void dyn_quantize_kernel(const T* x, const math_of<T>* inv, const math_of<T>* zpm,
                                    Q* out, DynArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  for (int64_t k = global_thread(); k < a.n; k += global_stride()) {
    int64_t q = qparam_of(a.d, k);
    out[k] = static_cast<Q>(qstore::quantize<M>(to_math(x[k]), inv[q], zpm[q], qmin, qmax).q);
  }
}

void dynamic_range_quantize_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, x.shape());
  DynArgs a{scope_dims(l),
            x.numel(),
            0,
            1,
            1,
            static_cast<int32_t>(r.qmin),
            static_cast<int32_t>(r.qmax),
            ctx.attrs.get_string("mode") == "symmetric",
            device_error_record(),
            ctx.node.id};
  a.per_q = elements_per_qparam(a.d);
  a.splits = reduction_splits(a.d.num_qparams, a.per_q, kThreads);
  a.chunk = a.per_q == 0 ? 1 : (a.per_q + a.splits - 1) / a.splits;
  int64_t nq = a.d.num_qparams;
  auto s = static_cast<cudaStream_t>(ctx.stream);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    using M = math_of<T>;
    DType mdt = sizeof(M) == 8 ? DType::f64 : DType::f32;
    Tensor partial = Tensor::empty({nq * a.splits * 2}, mdt, x.device());
    Tensor inv = Tensor::empty({nq}, mdt, x.device()), zpm = Tensor::empty({nq}, mdt, x.device());
    int64_t blocks = nq * a.splits;
    unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
    if (blocks > 0) {
      range_partial_kernel<T>
          <<<grid, kThreads, 0, s>>>(in_ptr<T>(x), out_ptr<Range<M>>(partial), a);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
      auto shape = elementwise_launch(nq);
      qparams_kernel<M><<<shape.blocks, shape.threads, 0, s>>>(
          in_ptr<Range<M>>(partial), out_ptr<float>(ctx.outputs[1]),
          out_ptr<int32_t>(ctx.outputs[2]), out_ptr<M>(inv), out_ptr<M>(zpm), a);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    }
    if (x.numel() == 0) return;
    auto shape = elementwise_launch(x.numel());
    if (ctx.outputs[0].dtype() == DType::i8)
      dyn_quantize_kernel<T, int8_t><<<shape.blocks, shape.threads, 0, s>>>(
          in_ptr<T>(x), in_ptr<M>(inv), in_ptr<M>(zpm), out_ptr<int8_t>(ctx.outputs[0]), a);
    else
      dyn_quantize_kernel<T, uint8_t><<<shape.blocks, shape.threads, 0, s>>>(
          in_ptr<T>(x), in_ptr<M>(inv), in_ptr<M>(zpm), out_ptr<uint8_t>(ctx.outputs[0]), a);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_dynamic_quant_cuda_kernels(OpRegistry& r) {
  r.get_mutable("dynamic_range_quantize")
      .kernels.push_back({DeviceType::cuda,
                          {DType::f32, DType::f64, DType::f16, DType::bf16},
                          dynamic_range_quantize_cuda});
}

}  // namespace qg
