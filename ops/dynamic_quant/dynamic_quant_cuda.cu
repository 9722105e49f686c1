// CUDA kernel for dynamic_range_quantize. min/max are exact (any order gives the same value;
// the sign of a zero cannot change the qparams), so codes, scales and zero points match the
// CPU bit for bit whatever the reduction order. An affine range too wide for f32 is recorded
// in the device error buffer, as the CPU raises.
//
// Fast path, when each scope owns one contiguous segment of at most 16384 elements (32768
// for 16-bit types in aligned packs) (per token, channel axis 0 of an outer == 1 layout,
// full groups along the last axis): a team of lanes per segment loads it once into
// registers (16-byte packs when aligned; up to 4 packs per lane, 8 for 16-bit types, the
// same register bytes), reduces the finite min/max (16-bit types two elements per
// instruction; shuffles within a warp, shared memory across warps), computes the qparams
// with the shared dynq::qparams, quantizes from the registers (cuda_rows.cuh's code_of, the
// codes of qstore::quantize) and writes the codes (8 per 8-byte store) and the segment's
// scale and zero point. One read, one write. The kernel is issue-bound once its loads are
// in flight, so the per-element steps are counted in SASS instructions (commit messages).
// General path, three launches that never leave the device: (1) blocks reduce fixed
// stretches of each scope to a finite (min, max) in the math type, (2) one thread per scope
// folds its stretches and computes (scale, zero_point), (3) every element is quantized
// with qstore::quantize and its scope's reciprocal scale.
#include "core/graph.h"
#include "ops/common/cuda_rows.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/dynamic_quant/dynamic_quant_args.h"
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

// ---- Fast path: one team of `tpr` lanes per contiguous segment, data held in registers.

// Elements per register slot: 8 (a Pack8, 16-byte loads) or 1 (scalar loads). A pack of a
// 16-bit type is held as 4 words of two elements each (kPairs): its range is reduced two
// elements per instruction (HFMA2 / HMNMX2) and each half is widened to f32 by one
// instruction.
template <typename T, int W>
inline constexpr bool kPairs = W == 8 && sizeof(T) == 2;

template <typename T, int W>
struct Slot {
  T v[W];
};
template <typename T>
struct WordSlot {
  uint32_t w[4];
};
template <typename T, int W>
using SlotOf = std::conditional_t<kPairs<T, W>, WordSlot<T>, Slot<T, W>>;

template <typename T, int W>
__device__ __forceinline__ SlotOf<T, W> load_slot(const T* __restrict__ row, uint32_t p) {
  SlotOf<T, W> s;
  if constexpr (kPairs<T, W>) {
    const uint4 u = reinterpret_cast<const uint4*>(row)[p];
    s.w[0] = u.x;
    s.w[1] = u.y;
    s.w[2] = u.z;
    s.w[3] = u.w;
  } else if constexpr (W == 8) {
    Pack8<T> pk = reinterpret_cast<const Pack8<T>*>(row)[p];
#pragma unroll
    for (int j = 0; j < 8; ++j) s.v[j] = pk.v[j];
  } else {
    s.v[0] = row[p];
  }
  return s;
}

// Folds a slot's finite values into [lo, hi] (the 16-bit types: into the half-wise
// [lo2, hi2], folded to f32 after the last slot).
template <typename T, int W>
__device__ __forceinline__ void add_range(const SlotOf<T, W>& s, Range<math_of<T>>& r,
                                          uint32_t& lo2, uint32_t& hi2) {
  if constexpr (kPairs<T, W>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t f = finite_or_nan2<T>(s.w[k]);
      lo2 = min2<T>(lo2, f);
      hi2 = max2<T>(hi2, f);
    }
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) {
      // Non-finite values become NaN, which fmin/fmax skip: no branch per element.
      const math_of<T> v = to_math(s.v[e]);
      math_of<T> m;
      if constexpr (std::is_same_v<math_of<T>, float>)
        m = finite_or_nan_fma(v);
      else
        m = finite_or_nan(v);
      r.lo = fmin_of(r.lo, m);
      r.hi = fmax_of(r.hi, m);
    }
  }
}

// The codes of a slot: qstore::quantize with M = f32 through code_of (same codes, see
// cuda_rows.cuh), with M = f64 as written.
template <typename T, int W>
__device__ __forceinline__ void slot_codes(const SlotOf<T, W>& s, math_of<T> inv, math_of<T> zpm,
                                           int32_t zp, const DynArgs& a, int32_t* c) {
  using M = math_of<T>;
  if constexpr (kPairs<T, W>) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      c[2 * k] = code_of(low_as_float<T>(s.w[k]) * inv, zp, a.qmin, a.qmax);
      c[2 * k + 1] = code_of(high_as_float<T>(s.w[k]) * inv, zp, a.qmin, a.qmax);
    }
  } else if constexpr (std::is_same_v<M, float>) {
#pragma unroll
    for (int e = 0; e < W; ++e) c[e] = code_of(to_math(s.v[e]) * inv, zp, a.qmin, a.qmax);
  } else {
    const M qmin = static_cast<M>(a.qmin), qmax = static_cast<M>(a.qmax);
#pragma unroll
    for (int e = 0; e < W; ++e) c[e] = qstore::quantize<M>(to_math(s.v[e]), inv, zpm, qmin, qmax).q;
  }
}

template <typename Q, int W>
__device__ __forceinline__ void store_codes(Q* __restrict__ row, uint32_t p, const int32_t* c) {
  if constexpr (W == 8) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      lo |= static_cast<uint32_t>(static_cast<uint8_t>(static_cast<Q>(c[j]))) << (8 * j);
      hi |= static_cast<uint32_t>(static_cast<uint8_t>(static_cast<Q>(c[j + 4]))) << (8 * j);
    }
    reinterpret_cast<uint2*>(row)[p] = make_uint2(lo, hi);
  } else {
    row[p] = static_cast<Q>(c[0]);
  }
}

constexpr int kMaxTeamWarps = 16;  // teams of up to 512 lanes

// Segment q = elements [q * len, (q + 1) * len). Block = rows_per_block teams of tpr =
// 2^tpr_log2 lanes; lane t of a team holds slots t, t + tpr, ..., up to V of them. (The
// team size comes as a shift: three 32-bit divisions by a runtime tpr cost ~50
// instructions per thread, about one per element of a lane.) kFull: every lane holds
// exactly V slots (len = V * tpr * W), so the slots need no bound check: one branch per
// row (the team's row exists) instead of one per slot (~3 instructions per pack each in
// the range and the quantize loops).
template <typename T, typename Q, int W, int V, bool kFull>
__global__ void __launch_bounds__(512)
    dyn_segment_kernel(const T* __restrict__ x, Q* __restrict__ out, float* __restrict__ scale,
                       int32_t* __restrict__ zp, DynArgs a, int64_t len, int tpr_log2) {
  using M = math_of<T>;
  __shared__ M s_lo[kMaxTeamWarps], s_hi[kMaxTeamWarps];
  const int tpr = 1 << tpr_log2, rows_per_block = static_cast<int>(blockDim.x >> tpr_log2);
  const int team = static_cast<int>(threadIdx.x >> tpr_log2);
  const int lane = static_cast<int>(threadIdx.x & static_cast<unsigned>(tpr - 1));
  const uint32_t nslots = static_cast<uint32_t>(len / W);
  const int64_t nseg = a.d.num_qparams;
  CombineRange<M> combine;
  // Every thread runs the same number of iterations, so the __syncthreads below are uniform.
  for (int64_t r0 = int64_t{blockIdx.x} * rows_per_block; r0 < nseg;
       r0 += int64_t{gridDim.x} * rows_per_block) {
    const int64_t q = r0 + team;
    const bool valid = q < nseg;
    const T* row = x + (valid ? q : 0) * len;
    SlotOf<T, W> v[V];
    Range<M> r{static_cast<M>(INFINITY), static_cast<M>(-INFINITY)};
    uint32_t lo2 = 0, hi2 = 0;
    if constexpr (kPairs<T, W>) {
      lo2 = pos_inf2<T>();
      hi2 = neg_inf2<T>();
    }
    auto holds = [&](int j) {
      return kFull || (valid && lane + j * static_cast<uint32_t>(tpr) < nslots);
    };
    if (!kFull || valid) {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (holds(j)) v[j] = load_slot<T, W>(row, lane + j * static_cast<uint32_t>(tpr));
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (holds(j)) add_range<T, W>(v[j], r, lo2, hi2);
    }
    if constexpr (kPairs<T, W>) {
      r.lo = fminf(low_as_float<T>(lo2), high_as_float<T>(lo2));
      r.hi = fmaxf(low_as_float<T>(hi2), high_as_float<T>(hi2));
    }
    const int team_in_warp = tpr < 32 ? tpr : 32;
    r.lo = team_reduce(r.lo, team_in_warp, [](M u, M w) { return min_of(u, w); });
    r.hi = team_reduce(r.hi, team_in_warp, [](M u, M w) { return max_of(u, w); });
    if (tpr > 32) {
      const int warp = threadIdx.x / 32, first = team * (tpr / 32);
      if (threadIdx.x % 32 == 0) {
        s_lo[warp] = r.lo;
        s_hi[warp] = r.hi;
      }
      __syncthreads();
      for (int w = first; w < first + tpr / 32; ++w) r = combine(r, Range<M>{s_lo[w], s_hi[w]});
      __syncthreads();
    }
    if (!valid) continue;
    dynq::QParams p = dynq::qparams(static_cast<float>(r.lo), static_cast<float>(r.hi),
                                    r.lo <= r.hi, a.symmetric, a.qmin, a.qmax);
    if (lane == 0) {
      if (p.overflow)
        report_device_error(a.err, kAffineOverflow, a.node, q, static_cast<double>(r.hi),
                            static_cast<double>(r.lo), static_cast<double>(r.hi));
      scale[q] = p.scale;
      zp[q] = p.zero_point;
    }
    const M inv = M(1) / static_cast<M>(p.scale), zpm = static_cast<M>(p.zero_point);
    Q* orow = out + q * len;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const uint32_t s = lane + j * static_cast<uint32_t>(tpr);
      if (!kFull && s >= nslots) continue;
      int32_t c[W];
      slot_codes<T, W>(v[j], inv, zpm, p.zero_point, a, c);
      store_codes<Q, W>(orow, s, c);
    }
  }
}

// The team shape of a segment of `len` elements read `w` at a time: a power-of-two team of
// at most 512 lanes with at most `max_slots` (a power of two <= 8) slots per lane; false
// when the segment does not fit.
struct TeamShape {
  int tpr, slots, tpr_log2;
};
bool team_shape(int64_t len, int w, int max_slots, TeamShape& t) {
  int64_t nslots = len / w;
  int64_t tpr = 1;
  int log2 = 0;
  for (; tpr * max_slots < nslots; ++log2) tpr *= 2;
  if (tpr > 32 * kMaxTeamWarps) return false;
  int64_t per = (nslots + tpr - 1) / tpr;
  int slots = 1;
  while (slots < per) slots *= 2;
  t = {static_cast<int>(tpr), slots, log2};
  return true;
}

// Slots per lane: 8 packs of a 16-bit type take the registers (and keep the bytes in
// flight) of 4 packs of f32; 4 otherwise.
template <typename T, int W>
constexpr int max_slots() {
  return kPairs<T, W> ? 8 : 4;
}

template <typename T, typename Q, int W>
void launch_segments(const Tensor& x, KernelContext& ctx, const DynArgs& a, int64_t len,
                     TeamShape t, cudaStream_t s) {
  // One segment per block from 64 lanes up (blocks do not wait on each other's
  // __syncthreads), several per 128-thread block below.
  const int threads = t.tpr >= 64 ? t.tpr : 128;
  const int64_t rows_per_block = threads / t.tpr;
  const int64_t blocks = (a.d.num_qparams + rows_per_block - 1) / rows_per_block;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  // Full teams (every lane V slots) only matter for packs; scalar rows keep the checks, and
  // so does f64 (its full kernel needs 128 registers where the checked one takes ~100).
  constexpr bool kMayBeFull = W == 8 && sizeof(T) <= 4;
  const bool full = kMayBeFull && len == int64_t{t.slots} * t.tpr * W;
  auto go = [&](auto vtag) {
    constexpr int V = decltype(vtag)::value;
    auto kernel = dyn_segment_kernel<T, Q, W, V, false>;
    if constexpr (kMayBeFull)
      if (full) kernel = dyn_segment_kernel<T, Q, W, V, true>;
    kernel<<<grid, threads, 0, s>>>(in_ptr<T>(x), out_ptr<Q>(ctx.outputs[0]),
                                    out_ptr<float>(ctx.outputs[1]),
                                    out_ptr<int32_t>(ctx.outputs[2]), a, len, t.tpr_log2);
  };
  if (t.slots == 1) go(std::integral_constant<int, 1>{});
  if (t.slots == 2) go(std::integral_constant<int, 2>{});
  if (t.slots == 4) go(std::integral_constant<int, 4>{});
  if constexpr (max_slots<T, W>() == 8)
    if (t.slots == 8) go(std::integral_constant<int, 8>{});
}

// Runs the fast path when the layout allows it; false otherwise.
template <typename T>
bool try_segments(const Tensor& x, KernelContext& ctx, const DynArgs& a, cudaStream_t s) {
  const int64_t len = contiguous_segment(a.d);
  if (len <= 0 || a.d.kind == ScopeKind::tensor) return false;
  const bool packs = len % 8 == 0 && aligned16(x.raw_data()) &&
                     (reinterpret_cast<uintptr_t>(ctx.outputs[0].raw_data()) & 7u) == 0;
  TeamShape t;
  if (!team_shape(len, packs ? 8 : 1, packs ? max_slots<T, 8>() : max_slots<T, 1>(), t))
    return false;
  const bool i8 = ctx.outputs[0].dtype() == DType::i8;
  if (packs && i8) launch_segments<T, int8_t, 8>(x, ctx, a, len, t, s);
  if (packs && !i8) launch_segments<T, uint8_t, 8>(x, ctx, a, len, t, s);
  if (!packs && i8) launch_segments<T, int8_t, 1>(x, ctx, a, len, t, s);
  if (!packs && !i8) launch_segments<T, uint8_t, 1>(x, ctx, a, len, t, s);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
  return true;
}

void dynamic_range_quantize_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const QuantRange& r = ctx.args<QuantScopeArgs>().range;
  const ScopeLayout& l = ctx.args<QuantScopeArgs>().layout;
  DynArgs a{scope_dims(l),
            x.numel(),
            0,
            1,
            1,
            static_cast<int32_t>(r.qmin),
            static_cast<int32_t>(r.qmax),
            ctx.args<DynamicQuantArgs>().symmetric,
            error_record(ctx.device),
            ctx.site};
  a.per_q = elements_per_qparam(a.d);
  a.splits = reduction_splits(a.d.num_qparams, a.per_q, kThreads);
  a.chunk = a.per_q == 0 ? 1 : (a.per_q + a.splits - 1) / a.splits;
  int64_t nq = a.d.num_qparams;
  auto s = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    using M = math_of<T>;
    if (try_segments<T>(x, ctx, a, s)) return;
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
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, dynamic_range_quantize_cuda});
}

}  // namespace qg
