// Device pieces shared by the single-kernel CUDA paths of fused_observe_quantize (rows,
// cooperative per-tensor / per-column, delayed per-tensor): batch statistics, the observer
// update and qparams, and the quantize-and-store of one 16-byte pack with its mask bits.
// Every decision is the unfused kernels' (the same qmath/qstore/obsmath element functions and
// tie rules), so fused results equal the unfused graph bit for bit.
#pragma once

#include <type_traits>

#include "ops/common/cuda_common.cuh"
#include "ops/common/peer_exchange.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/observer/observer_math.h"
#include "ops/quantize/quantize_math.h"

namespace qg::cuda::fused {

constexpr int kThreads = 256;

// Batch statistics with the CPU observers' rule for signed zeros (obsmath::ordered_min /
// ordered_max: -0 wins the min, +0 the max), which makes them independent of the reduction
// order. The hot loop uses plain fminf/fmaxf and only records which zero signs it saw; the
// sign of a zero extreme is settled once at the end (finish()). `Count` is 32-bit where a
// count cannot outgrow it (one thread's elements) and keeps per-column partials at 16 bytes.
template <typename Count>
struct MinMaxOf {
  float mn, mx;
  unsigned zeros;  // bit 0: saw -0, bit 1: saw +0
  Count nonfinite;
};
using MinMax = MinMaxOf<unsigned long long>;
using ColumnMinMax = MinMaxOf<unsigned>;
static_assert(sizeof(ColumnMinMax) == 16, "per-column partials move as one 16-byte word");

template <typename M = MinMax>
__device__ __forceinline__ M minmax_identity() {
  return {INFINITY, -INFINITY, 0u, 0u};
}

template <typename Count>
__device__ __forceinline__ void minmax_add(MinMaxOf<Count>& m, float v) {
  bool finite = fabsf(v) < INFINITY;  // false for NaN and +/-Inf
  m.nonfinite += finite ? 0u : 1u;
  m.mn = finite ? fminf(m.mn, v) : m.mn;
  m.mx = finite ? fmaxf(m.mx, v) : m.mx;
  unsigned bits = __float_as_uint(v);
  unsigned zero = (bits << 1) == 0u;
  m.zeros |= zero << (1u - (bits >> 31));  // -0 -> bit 0, +0 -> bit 1
}

template <typename Count>
__device__ __forceinline__ MinMax combine(MinMax a, const MinMaxOf<Count>& b) {
  a.mn = fminf(a.mn, b.mn);
  a.mx = fmaxf(a.mx, b.mx);
  a.zeros |= b.zeros;
  a.nonfinite += b.nonfinite;
  return a;
}

__device__ __forceinline__ MinMax finish(MinMax m) {
  if (m.mn == 0.0f) m.mn = (m.zeros & 1u) ? -0.0f : 0.0f;
  if (m.mx == 0.0f) m.mx = (m.zeros & 2u) ? 0.0f : -0.0f;
  return m;
}

// Combines across `lanes` consecutive lanes (a power of two <= 32); every lane of the warp
// must call it.
__device__ __forceinline__ MinMax lanes_reduce(MinMax m, int lanes) {
  for (int off = lanes / 2; off > 0; off >>= 1) {
    MinMax o;
    o.mn = __shfl_xor_sync(0xffffffffu, m.mn, off);
    o.mx = __shfl_xor_sync(0xffffffffu, m.mx, off);
    o.zeros = __shfl_xor_sync(0xffffffffu, m.zeros, off);
    o.nonfinite = __shfl_xor_sync(0xffffffffu, m.nonfinite, off);
    m = combine(m, o);
  }
  return m;
}

__device__ __forceinline__ MinMax warp_reduce(MinMax m) {
  return lanes_reduce(m, 32);
}

// Block-wide combine (the operation is order-independent); every thread gets the result.
__device__ inline MinMax block_minmax(MinMax m) {
  __shared__ MinMax warps[32];
  __shared__ MinMax result;
  m = warp_reduce(m);
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (warp == 0) {
    int nwarps = (blockDim.x + 31) >> 5;
    MinMax w = lane < nwarps ? warps[lane] : minmax_identity();
    w = warp_reduce(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  MinMax r = result;
  __syncthreads();
  return r;
}

// Everything the fused kernels need besides x, y and the mask.
struct FusedArgs {
  bool moving_average;
  bool delayed;  // quantize with the qparams of the state before this batch
  float averaging_constant;
  bool training;
  qmath::QParamsConfig cfg;
  float qmin, qmax;  // the quantizer's range
  float* st_min;
  float* st_max;
  uint8_t* st_init;  // moving average only
  unsigned long long* nonfinite;
  const uint8_t* observer_enabled;
  const uint8_t* fake_quant_enabled;  // null when the quantizer has no flag
  float* scale_out;
  int32_t* zp_out;
  // Where qparams the quantizer would reject are recorded (raised after the run, as the
  // unfused quantizer raises), and the fused node's id for the message.
  DeviceErrorRecord* err;
  int32_t node;
  // Data parallelism: the mailbox the per-tensor range is combined through inside the kernel
  // (peers.ranks > 1), or none (peers.ranks == 0: this rank's statistics are the batch's).
  PeerMailbox peers;
};

// The qparams one element is quantized with.
struct QP {
  float scale, inv, zp;
  bool on;  // fake_quant_enabled
};

// One QP for every element of a pack (per tensor, per row) ...
struct UniformQP {
  QP qp;
  __device__ __forceinline__ const QP& at(int) const { return qp; }
};
// ... or one per element (channels along the last axis: a pack spans N channels).
template <int N>
struct ColumnQP {
  QP qp[N];
  __device__ __forceinline__ const QP& at(int e) const { return qp[e]; }
};

// The observer state of one qparam as it was before this launch.
struct Running {
  float mn, mx;
  bool init;
};

__device__ __forceinline__ Running read_state(const FusedArgs& a, int64_t q) {
  return {a.st_min[q], a.st_max[q], a.st_init != nullptr && a.st_init[q] != 0};
}

// The two device flags, read once per launch (nothing changes them while a kernel runs).
struct Flags {
  bool observe, quantize;
};

__device__ __forceinline__ Flags read_flags(const FusedArgs& a) {
  return {*a.observer_enabled != 0, a.fake_quant_enabled == nullptr || *a.fake_quant_enabled != 0};
}

// The QP the unfused quantizer derives from a (scale, zero_point) pair.
__device__ __forceinline__ QP qp_of(float scale, int32_t zero_point, const Flags& f) {
  return {scale, 1.0f / scale, static_cast<float>(zero_point), f.quantize};
}

// The observer update for qparam q from this batch's (min, max), then the qparams; the same
// decisions as the CPU kernels. `old` is the state before this launch (read before any
// thread could write it). `write` is false for threads that only need the result.
__device__ inline QP update_and_qparams(const FusedArgs& a, const Flags& f, int64_t q,
                                        const Running& old, const MinMax& b, bool nonempty,
                                        bool write) {
  float mn = old.mn, mx = old.mx;
  const bool old_valid = a.moving_average ? old.init : old.mn <= old.mx;
  const qmath::QParams before = qmath::qparams_from_range(old.mn, old.mx, old_valid, a.cfg);
  bool update = a.training && f.observe && nonempty;
  bool valid;
  if (a.moving_average) {
    bool init = old.init;
    if (update && b.mn <= b.mx) {
      if (init) {
        mn = obsmath::moving_average(mn, b.mn, a.averaging_constant);
        mx = obsmath::moving_average(mx, b.mx, a.averaging_constant);
      } else {
        mn = b.mn;
        mx = b.mx;
      }
      init = true;
    }
    valid = init;
    if (write) a.st_init[q] = init ? 1 : 0;
  } else {
    if (update) {
      mn = obsmath::ordered_min(mn, b.mn);
      mx = obsmath::ordered_max(mx, b.mx);
    }
    valid = mn <= mx;
  }
  const qmath::QParams p = a.delayed ? before : qmath::qparams_from_range(mn, mx, valid, a.cfg);
  if (write) {
    a.st_min[q] = mn;
    a.st_max[q] = mx;
    a.scale_out[q] = p.scale;
    a.zp_out[q] = p.zero_point;
    if (update && b.nonfinite) atomicAdd(a.nonfinite, b.nonfinite);
    // The unfused quantizer rejects these qparams (an observed range wider than f32 gives an
    // infinite scale): the fused node must fail the same way, not quantize with them.
    if (f.quantize && !(isfinite(p.scale) && p.scale > 0.0f))
      report_device_error(a.err, kBadScale, a.node, q, static_cast<double>(p.scale));
    if (f.quantize && !(p.zero_point >= a.qmin && p.zero_point <= a.qmax))
      report_device_error(a.err, kBadZeroPoint, a.node, q, static_cast<double>(p.zero_point),
                          static_cast<double>(a.qmin), static_cast<double>(a.qmax));
  }
  return qp_of(p.scale, p.zero_point, f);
}

// N storage codes of one pack (the quantize quantizer's output), stored as one N-byte word.
template <int N>
struct alignas(N) Codes {
  uint8_t v[N];
};

// Stores v at *dst as one word; kStream marks it evict-first in L2 (st.global.cs), so output
// written while x is still to be re-read does not push x out of L2.
template <bool kStream, typename V>
__device__ __forceinline__ void store_word(V* dst, const V& v) {
  if constexpr (kStream) {
    using W =
        std::conditional_t<sizeof(V) == 16, int4, std::conditional_t<sizeof(V) == 8, int2, int>>;
    static_assert(sizeof(V) == sizeof(W) && alignof(V) >= alignof(W), "one aligned word");
    __stcs(reinterpret_cast<W*>(dst), *reinterpret_cast<const W*>(&v));
  } else {
    *dst = v;
  }
}

// Quantizes pack `in` (element index j * N) with qps.at(e) and stores it at y[j]:
// fake-quantized values of type T, or (kCodes) s8/u8 codes with qstore::quantize's rules.
// Returns the in-range bits (bit e for element e).
template <bool kCodes, bool kStream = false, typename T, int N, typename QPs>
__device__ __forceinline__ uint32_t quantize_store(const Pack<T, N>& in, void* y, int64_t j,
                                                   const QPs& qps, float qmin, float qmax) {
  uint32_t bits = 0;
  if constexpr (kCodes) {
    Codes<N> out;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const QP& qp = qps.at(e);
      qstore::Code c = qstore::quantize<float>(to_math(in.v[e]), qp.inv, qp.zp, qmin, qmax);
      out.v[e] = static_cast<uint8_t>(c.q);  // the low byte: s8 and u8 storage alike
      bits |= static_cast<uint32_t>(c.in_range) << e;
    }
    store_word<kStream>(static_cast<Codes<N>*>(y) + j, out);
  } else {
    Pack<T, N> out;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const QP& qp = qps.at(e);
      if (qp.on) {
        auto r = qmath::fake_quant<float>(to_math(in.v[e]), qp.inv, qp.scale, qp.zp, qmin, qmax);
        out.v[e] = from_math<T>(r.y);
        bits |= static_cast<uint32_t>(r.in_range) << e;
      } else {
        out.v[e] = in.v[e];
        bits |= 1u << e;
      }
    }
    store_word<kStream>(static_cast<Pack<T, N>*>(y) + j, out);
  }
  return bits;
}

// Gathers the N-bit groups of the 32 / N consecutive lanes that share a 32-bit mask word;
// the first lane of each group stores it at *word (its address, computed by the caller:
// kernels that walk packs at fixed strides fold it into immediate offsets). Every lane of
// the warp must call this.
template <int N>
__device__ __forceinline__ void store_mask_word(uint32_t* word, uint32_t bits, bool active) {
  constexpr int kLanesPerWord = 32 / N;
  int lane = threadIdx.x & 31;
  uint32_t w = active ? bits << ((lane % kLanesPerWord) * N) : 0u;
#pragma unroll
  for (int off = 1; off < kLanesPerWord; off <<= 1) w |= __shfl_xor_sync(0xffffffffu, w, off);
  if (active && lane % kLanesPerWord == 0) *word = w;
}

// The same for pack index `pack` (>= 0) of the mask `words`.
template <int N, typename I>
__device__ __forceinline__ void store_mask_bits(uint32_t* words, I pack, uint32_t bits,
                                                bool active) {
  // The unsigned division is a shift (the signed one needs a rounding fix-up).
  store_mask_word<N>(words + static_cast<std::make_unsigned_t<I>>(pack) / (32 / N), bits, active);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(std::bool_constant<kCodes>{}, TypeTag<T>{}) for the element types with a
// single-kernel path (f32, f16, bf16); false for the others.
template <typename Fn>
bool dispatch_codes_dtype(bool codes, DType dtype, Fn&& fn) {
  auto with_codes = [&](auto tag) {
    if (codes) return fn(std::true_type{}, tag);
    return fn(std::false_type{}, tag);
  };
  switch (dtype) {
    case DType::f32:
      return with_codes(TypeTag<float>{});
    case DType::f16:
      return with_codes(TypeTag<__half>{});
    case DType::bf16:
      return with_codes(TypeTag<__nv_bfloat16>{});
    default:
      return false;
  }
}

// The launches, one per file; each returns false when its layout conditions fail (the node
// then runs the composed kernels). x, y and the mask are ctx.inputs[0], ctx.outputs[0, 1].
// Rows: one contiguous row of x per qparam, row_len elements each.
bool launch_fused_rows(KernelContext& ctx, const FusedArgs& a, bool codes, int64_t rows,
                       int64_t row_len);
// Per tensor, a cooperative grid with a grid barrier.
bool launch_fused_tensor(KernelContext& ctx, const FusedArgs& a, bool codes);
// The same for fake_quantize, with `activation` (relu, gelu or silu) applied to x on load.
bool launch_fused_tensor_prologue(KernelContext& ctx, const FusedArgs& a,
                                  const KernelPart& activation);
// Per channel along the last axis of [rows, columns]: a cooperative grid, two grid barriers.
bool launch_fused_columns(KernelContext& ctx, const FusedArgs& a, bool codes, int64_t columns);
// Per channel on a middle axis of [outer, channels, inner]: a cooperative grid, two barriers.
bool launch_fused_middle(KernelContext& ctx, const FusedArgs& a, bool codes, int64_t channels,
                         int64_t inner);
// Per tensor, delayed mode: one pass, the last block folds the statistics.
bool launch_fused_tensor_delayed(KernelContext& ctx, const FusedArgs& a, bool codes);

// Data parallelism, per tensor: the block's range combined with every rank's through the peer
// mailbox, exchange `e` (read by thread 0 before any block could advance it). The `publisher`
// block sends this rank's range (zero signs settled, as the unfused observer sends it:
// range_word) and its non-finite count, then advances the count of exchanges; every block
// waits for the ranks' flags and folds their words, so all blocks of all ranks hold the same
// global range. Every thread calls it; the result's zero bits carry the settled signs, so
// finish() keeps them.
__device__ inline MinMax peer_combine(const FusedArgs& a, unsigned long long e, const MinMax& mine,
                                      bool publisher) {
  __shared__ MinMax result;
  if (threadIdx.x == 0) {
    const PeerMailbox& m = a.peers;
    if (publisher) {
      const MinMax settled = finish(mine);
      peer_put(m, e, 0, range_word(settled.mn, settled.mx));
      peer_put(m, e, 1, mine.nonfinite);
      peer_raise(m, e);
    }
    const bool ok = peer_wait(m, e, a.err, a.node);
    RangeFold range;
    unsigned long long nonfinite = 0;
    for (int r = 0; r < m.ranks; ++r) {
      if (!ok && r != m.rank) continue;
      range.add(peer_get(m, e, r, 0));
      nonfinite += peer_get(m, e, r, 1);
    }
    if (publisher) peer_finish_exchange(m, e);
    const float mn = range.mn(), mx = range.mx();
    const unsigned zeros =
        (mn == 0.0f && signbit(mn) ? 1u : 0u) | (mx == 0.0f && !signbit(mx) ? 2u : 0u);
    result = MinMax{mn, mx, zeros, nonfinite};
  }
  __syncthreads();
  const MinMax r = result;
  __syncthreads();
  return r;
}

}  // namespace qg::cuda::fused
