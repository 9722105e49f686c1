// CUDA kernels for lsq_fake_quantize and lsq_backward. The element math is the shared
// lsq::forward / lsq::element_grad, with qparams read through f64 exactly as the CPU reads
// them, so y and dx are bit-identical to the CPU. Bad qparams are recorded in the device
// error buffer and raised at the end of the run.
//
// Forward: element-wise over packs of 8 (16-byte loads, blocks streaming contiguous runs),
// with the qparams loaded once per thread (per tensor), once per pack (when packs never
// straddle two qparams) or per element (cached while the index repeats); 32-bit index
// arithmetic below 2^31 elements.
// Backward, one launch: the scale and zero-point gradients are f64 sums over each qparam's
// elements. Block (q, s) handles a fixed stretch s of qparam q's elements, writes dx and
// reduces its terms with a fixed tree; the block that finishes q's last stretch (a ticket
// per qparam) adds q's stretch sums in a fixed order and applies grad_factor once. The
// assignment depends only on the shape, and the fold order not on which block comes last:
// deterministic run to run. When each qparam owns one contiguous segment (per tensor,
// channel axis 0 of an outer == 1 layout, full groups) a stretch is kThreads * 64 elements
// read as packs, like an element-wise kernel.
#include "core/graph.h"
#include "ops/common/cuda_vec.cuh"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/lsq/lsq_cpu.h"
#include "ops/lsq/lsq_math.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

enum class QLayout { tensor, pack, element };

struct LsqArgs {
  ScopeDims d;
  double qmin, qmax;
  int64_t n, per_q, splits, chunk;
  int64_t segment;  // contiguous_segment(d), 0 when qparams do not own contiguous segments
  bool vec;         // every tensor read or written element-wise is 16-byte aligned
  DeviceErrorRecord* err;
  int32_t node;
};

template <typename M>
struct QParam {
  M scale, inv, zp_int;
};

// The qparams of q as the CPU derives them: validated, converted to M, zp rounded and clamped.
template <typename M, typename S, typename Z, typename I>
__device__ __forceinline__ QParam<M> load_qparam(const S* scale, const Z* zp, I q,
                                                 const LsqArgs& a) {
  double s = static_cast<double>(scale[q]), z = static_cast<double>(zp[q]);
  const int64_t q64 = static_cast<int64_t>(q);
  if (!(qmath::is_finite(s) && s > 0)) report_device_error(a.err, kBadScale, a.node, q64, s);
  if (!qmath::is_finite(z)) report_device_error(a.err, kNonFiniteZeroPoint, a.node, q64, z);
  M sm = static_cast<M>(s);
  return {
      sm, M(1) / sm,
      lsq::zero_point_int<M>(static_cast<M>(z), static_cast<M>(a.qmin), static_cast<M>(a.qmax))};
}

template <typename T, typename S, typename Z, typename I, QLayout L>
__global__ void __launch_bounds__(kPackThreads)
    lsq_forward_kernel(const T* __restrict__ x, const S* __restrict__ scale,
                       const Z* __restrict__ zp, T* __restrict__ y, LsqArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  const I n = static_cast<I>(a.n), nfull = n / 8;
  auto cache = last_qparam<QParam<M>, I>([=](I qi) { return load_qparam<M>(scale, zp, qi, a); });
  if (L == QLayout::tensor) cache.get(0);
  auto element = [&](T xv, const QParam<M>& p) {
    return from_math<T>(lsq::forward<M>(to_math(xv), p.inv, p.scale, p.zp_int, qmin, qmax));
  };
  auto load = [&](I b) { return load_pack(x, b, a.vec); };
  flat_packs<kPacksPerThread<T>>(nfull, load, [&](I b, const Pack8<T>& xv) {
    Pack8<T> yv;
    if (L == QLayout::pack) cache.get(qparam_index_of<I>(a.d, b * 8));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (L == QLayout::element) cache.get(qparam_index_of<I>(a.d, b * 8 + j));
      yv.v[j] = element(xv.v[j], cache.p);
    }
    store_pack(y, b, a.vec, yv);
  });
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (I k = nfull * 8; k < n; ++k) y[k] = element(x[k], cache.get(qparam_index_of<I>(a.d, k)));
}

struct Sums {
  double dscale, dzp;
};
struct AddSums {
  __device__ Sums operator()(Sums a, Sums b) const { return {a.dscale + b.dscale, a.dzp + b.dzp}; }
};

// Deterministic block sum for the contiguous kernel: a fixed shuffle tree per warp, then
// warp 0 adds the warps' sums in a fixed tree. Thread 0 gets the result.
__device__ __forceinline__ Sums block_sum(Sums v) {
  __shared__ Sums warp_sums[kThreads / 32];
  for (int off = 16; off > 0; off /= 2) {
    v.dscale += __shfl_down_sync(0xffffffffu, v.dscale, off);
    v.dzp += __shfl_down_sync(0xffffffffu, v.dzp, off);
  }
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : Sums{0, 0};
    for (int off = 16; off > 0; off /= 2) {
      v.dscale += __shfl_down_sync(0xffffffffu, v.dscale, off);
      v.dzp += __shfl_down_sync(0xffffffffu, v.dzp, off);
    }
  }
  __syncthreads();
  return v;
}

// Element k's dx, and its terms added to acc.
template <typename T, typename M>
__device__ __forceinline__ T grad_element(T xv, T dyv, const QParam<M>& p, M qmin, M qmax,
                                          Sums& acc) {
  auto e = lsq::element_grad<M>(to_math(xv), to_math(dyv), p.inv, p.scale, p.zp_int, qmin, qmax);
  acc.dscale += e.dscale;
  acc.dzp += e.dzp;
  return from_math<T>(e.dx);
}

// Where the backward puts its results: dx, the per-stretch sums, one ticket per qparam
// (zeroed before the launch), and dscale / dzero_point in the scale's and zero point's types.
template <typename T, typename S, typename Z>
struct BackwardOut {
  T* dx;
  Sums* partial;
  unsigned* tickets;
  S* dscale;
  Z* dzp;
  double grad_factor;
};

// Publishes block (q, s)'s sum; the block that takes q's last ticket adds q's stretches
// (thread t: stretches t, t + kThreads, ..., then block_sum's fixed tree) and writes the
// gradients. Every thread of the block calls this.
template <typename T, typename S, typename Z>
__device__ void publish_and_fold(const BackwardOut<T, S, Z>& o, int64_t q, int64_t s,
                                 int64_t splits, Sums total) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    o.partial[q * splits + s] = total;
    __threadfence();  // the sum is visible before the ticket is taken
    last = atomicAdd(&o.tickets[q], 1u) == static_cast<unsigned>(splits - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Sums acc{0, 0};
  for (int64_t k = threadIdx.x; k < splits; k += blockDim.x) {
    const Sums* p = o.partial + q * splits + k;  // written by other blocks: read through L2
    acc = AddSums{}(acc, Sums{__ldcg(&p->dscale), __ldcg(&p->dzp)});
  }
  Sums all = block_sum(acc);
  if (threadIdx.x == 0) {
    o.dscale[q] = static_cast<S>(o.grad_factor * all.dscale);
    o.dzp[q] = static_cast<Z>(o.grad_factor * all.dzp);
  }
}

// Block (q, s) of a contiguous layout: stretch [lo, hi) of segment q = elements
// [q * segment + lo, q * segment + hi). Packs when a.vec and the segment and chunk are
// multiples of 8 (checked by the host), else element by element.
template <typename T, typename S, typename Z, typename I>
__global__ void __launch_bounds__(kThreads)
    lsq_backward_contiguous_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                   const S* __restrict__ scale, const Z* __restrict__ zp,
                                   BackwardOut<T, S, Z> o, LsqArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  const I splits = static_cast<I>(a.splits), chunk = static_cast<I>(a.chunk);
  const I seg = static_cast<I>(a.segment), nblocks = static_cast<I>(a.d.num_qparams) * splits;
  for (I b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const I q = b / splits, s = b % splits;
    const I lo = s * chunk, hi = lo + chunk < seg ? lo + chunk : seg;
    const QParam<M> p = load_qparam<M>(scale, zp, q, a);
    Sums acc{0, 0};
    if (a.vec) {
      struct In {
        Pack8<T> x, dy;
      };
      const I p0 = (q * seg + lo) / 8, np = (hi - lo) / 8;
      const I stride = blockDim.x;
      auto load = [&](I i) { return In{load_pack(x, p0 + i, true), load_pack(dy, p0 + i, true)}; };
      // Software pipeline: the next pack's loads are in flight while this one is computed.
      I i = threadIdx.x;
      In cur;
      if (i < np) cur = load(i);
      for (; i < np; i += stride) {
        In next;
        if (i + stride < np) next = load(i + stride);
        Pack8<T> out;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          out.v[j] = grad_element(cur.x.v[j], cur.dy.v[j], p, qmin, qmax, acc);
        store_pack(o.dx, p0 + i, true, out);
        cur = next;
      }
    } else {
      const I base = q * seg;
      for (I r = lo + threadIdx.x; r < hi; r += blockDim.x)
        o.dx[base + r] = grad_element(x[base + r], dy[base + r], p, qmin, qmax, acc);
    }
    publish_and_fold(o, q, s, splits, block_sum(acc));
  }
}

// Any layout: block (q, s) walks stretch s of q's elements through scope_element.
template <typename T, typename S, typename Z>
__global__ void __launch_bounds__(kThreads)
    lsq_backward_kernel(const T* dy, const T* x, const S* scale, const Z* zp,
                        BackwardOut<T, S, Z> o, LsqArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
  for (int64_t b = blockIdx.x; b < a.d.num_qparams * a.splits; b += gridDim.x) {
    int64_t q = b / a.splits, s = b % a.splits;
    int64_t lo = s * a.chunk, hi = lo + a.chunk < a.per_q ? lo + a.chunk : a.per_q;
    const QParam<M> p = load_qparam<M>(scale, zp, q, a);
    Sums acc{0, 0};
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
      int64_t k;
      if (!scope_element(a.d, q, r, k)) break;
      o.dx[k] = grad_element(x[k], dy[k], p, qmin, qmax, acc);
    }
    publish_and_fold(o, q, s, a.splits, block_sum(acc));
  }
}

LsqArgs make_args(const KernelContext& ctx, const Tensor& x) {
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  LsqArgs a{scope_dims(l),
            static_cast<double>(r.qmin),
            static_cast<double>(r.qmax),
            x.numel(),
            0,
            1,
            1,
            0,
            false,
            error_record(ctx.device),
            ctx.site};
  a.per_q = elements_per_qparam(a.d);
  return a;
}

// Stretches for the backward. Contiguous layouts: kThreads * 64 elements per block (8 packs
// per thread, each pack's loads issued while the previous one is computed), so the grid
// streams x and dy like an element-wise kernel; the chunk is a multiple of 8, so stretches
// start on pack boundaries. Other layouts: the shared reduction_splits().
void plan_backward(LsqArgs& a, bool aligned) {
  a.segment = a.n < (int64_t{1} << 31) ? contiguous_segment(a.d) : 0;
  if (a.segment > 0) {
    a.chunk = int64_t{kThreads} * 64;
    a.splits = (a.segment + a.chunk - 1) / a.chunk;
    a.vec = aligned && a.segment % 8 == 0;
    return;
  }
  a.splits = reduction_splits(a.d.num_qparams, a.per_q, kThreads);
  a.chunk = a.per_q == 0 ? 1 : (a.per_q + a.splits - 1) / a.splits;
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
  a.vec = aligned16(x.raw_data()) && aligned16(ctx.outputs[0].raw_data());
  auto st = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_qparams(ctx.inputs[1], ctx.inputs[2], [&](auto stag, auto ztag) {
      using S = decltype(stag);
      using Z = decltype(ztag);
      const T* px = in_ptr<T>(x);
      const S* ps = in_ptr<S>(ctx.inputs[1]);
      const Z* pz = in_ptr<Z>(ctx.inputs[2]);
      T* py = out_ptr<T>(ctx.outputs[0]);
      const unsigned grid = pack_blocks<kPacksPerThread<T>>(a.n / 8);
      auto go = [&](auto kernel) { kernel<<<grid, kPackThreads, 0, st>>>(px, ps, pz, py, a); };
      dispatch_index(a.n, [&](auto itag) {
        using I = decltype(itag);
        if constexpr (std::is_same_v<I, uint32_t>) {
          if (a.d.kind == ScopeKind::tensor)
            return go(lsq_forward_kernel<T, S, Z, I, QLayout::tensor>);
          if (runs_share_qparam(a.d, 8)) return go(lsq_forward_kernel<T, S, Z, I, QLayout::pack>);
        }
        go(lsq_forward_kernel<T, S, Z, I, QLayout::element>);
      });
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void lsq_backward_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& x = ctx.inputs[1];
  const bool aligned =
      aligned16(dy.raw_data()) && aligned16(x.raw_data()) && aligned16(ctx.outputs[0].raw_data());
  LsqArgs a = make_args(ctx, x);
  plan_backward(a, aligned);
  const int64_t nq = a.d.num_qparams, blocks = nq * a.splits;
  if (blocks == 0) return;
  // One scratch buffer: the stretch sums, then one ticket per qparam (zeroed).
  const int64_t sums_bytes = blocks * static_cast<int64_t>(sizeof(Sums));
  Tensor scratch = Tensor::empty({sums_bytes + nq * 4}, DType::u8, x.device());
  auto* tickets = reinterpret_cast<unsigned*>(static_cast<char*>(scratch.raw_data()) + sums_bytes);
  auto st = cuda_stream(ctx.device);
  QG_CUDA_CHECK(ctx.op, cudaMemsetAsync(tickets, 0, static_cast<size_t>(nq) * 4, st));
  const double g = ctx.args<LsqBackwardArgs>().grad_factor;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    // dscale takes scale's dtype and dzero_point zero_point's (as the CPU stores them).
    dispatch_qparams(ctx.inputs[2], ctx.inputs[3], [&](auto stag, auto ztag) {
      using S = decltype(stag);
      using Z = decltype(ztag);
      BackwardOut<T, S, Z> o{out_ptr<T>(ctx.outputs[0]), out_ptr<Sums>(scratch),     tickets,
                             out_ptr<S>(ctx.outputs[1]), out_ptr<Z>(ctx.outputs[2]), g};
      auto kernel = a.segment > 0 ? lsq_backward_contiguous_kernel<T, S, Z, uint32_t>
                                  : lsq_backward_kernel<T, S, Z>;
      kernel<<<grid, kThreads, 0, st>>>(in_ptr<T>(dy), in_ptr<T>(x), in_ptr<S>(ctx.inputs[2]),
                                        in_ptr<Z>(ctx.inputs[3]), o, a);
    });
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_lsq_cuda_kernels(OpRegistry& r) {
  r.get_mutable("lsq_fake_quantize")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, lsq_forward_cuda});
  r.get_mutable("lsq_backward")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, lsq_backward_cuda});
}

}  // namespace qg
