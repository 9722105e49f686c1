// CUDA kernels of dynamic_fake_quantize. One warp per group: the lanes stride through the
// group for its minimum and maximum (NaN wins, as torch.amin / amax), every lane then
// computes the same qparams (dynamic_fake_quantize_math.h, shared with the CPU kernel), lane
// 0 stores them, and a second pass over the group, which the warp has just read and which
// is still in L1, writes y and the mask. So x is read from memory once and nothing waits for
// the host. When a group is a whole number of 32-element mask words (every recipe shape:
// rows of 1024 or 2816, groups of 32 to 256), the warp's 32 in-range bits of each step are
// one aligned mask word; other group lengths leave y and the mask to a per-mask-byte kernel
// reading the stored qparams. Bit-identical to the CPU kernel: the same qparam and element
// math (dfq::fake_quant_element) in the same math type, y narrowed once. Each kernel is
// instantiated for the integer modes and for float_zero (kFloatZero), whose zero point output
// is f32 instead of i32.
//
// y's element type O is T, or (out_dtype) bf16/f16 for an f32 T: the fused cast of a weight to
// a mixed-precision GEMM, narrowing the f32 result once, as the cast op would (narrow_out).
//
// The common case (f32/f16/bf16, groups a whole number of 8-element packs, 16-byte aligned
// tensors) takes team_kernel instead: a power-of-two team of lanes per group, each lane a
// 16-byte pack of 8 elements per step (one mask byte), several packs in flight per lane. A
// warp per group with 2-byte loads kept about 2 KB in flight per SM, far below what HBM
// needs; packs of 8 give each lane 8x the bytes per load, and teams of 4-16 lanes let short
// weight groups (32-128 elements) fill a warp instead of idling 28 of its lanes. Packed, the
// kernel was then bound by instructions (about 38 an element on bf16 rows): its statistics
// now use paired NaN-propagating min/max (ops/common/cuda_minmax.cuh), and a valid group
// takes an element rule without NaN handling (fake_quant_pack_fast), about 14 in all.
#include <type_traits>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_minmax.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/dynamic_fake_quantize/dynamic_fake_quantize_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kWarpsPerBlock = 8;

// The zero point output: i32 codes, or float_zero's f32 values.
template <bool kFloatZero, typename M>
__device__ __forceinline__ void store_zero_point(void* zp, int64_t q, M v) {
  if constexpr (kFloatZero)
    static_cast<float*>(zp)[q] = static_cast<float>(v);
  else
    static_cast<int32_t*>(zp)[q] = static_cast<int32_t>(v);
}

// y's element from the math-type result: narrowed to T, then (O narrower) cast as the cast op
// casts (cast_cuda.cu: from_math of the widened value).
template <typename T, typename O>
__device__ __forceinline__ O narrow_out(math_of<T> y) {
  if constexpr (std::is_same_v<T, O>)
    return from_math_select<T>(y);
  else
    return from_math<O>(static_cast<math_of<O>>(to_math(from_math_select<T>(y))));
}

struct LaunchArgs {
  int64_t groups, len;
  dfq::Config cfg;
  bool quantize;  // the group length is a whole number of mask words: y and mask here
  DeviceErrorRecord* err;
  int32_t node;
};

// scale_m, zero_m: the scales (and float_zero's zeros) in the math type for byte_kernel (f64's
// would lose bits as f32), or null.
template <typename T, typename O, bool kFloatZero>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    group_kernel(const T* __restrict__ x, O* __restrict__ y, uint32_t* __restrict__ mask,
                 float* __restrict__ scale, void* __restrict__ zp, math_of<T>* scale_m,
                 math_of<T>* zero_m, LaunchArgs a) {
  using M = math_of<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t q = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5); q < a.groups;
       q += warps) {
    const T* g = x + q * a.len;
    M mn = to_math(g[0]), mx = mn;
    for (int64_t i = lane; i < a.len; i += 32) {
      const M v = to_math(g[i]);
      mn = nan_min(mn, v);
      mx = nan_max(mx, v);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      mn = nan_min(mn, __shfl_xor_sync(0xffffffffu, mn, off));
      mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    }
    const dfq::QParams<M> p = dfq::qparams(mn, mx, a.cfg);
    if (lane == 0) {
      if (!p.valid) report_device_error(a.err, kBadScale, a.node, q, static_cast<double>(p.scale));
      scale[q] = static_cast<float>(p.scale);
      store_zero_point<kFloatZero>(zp, q, p.zero_point);
      if (scale_m != nullptr) scale_m[q] = p.scale;
      if (zero_m != nullptr) zero_m[q] = p.zero_point;
    }
    if (!a.quantize) continue;
    const M inv = M(1) / p.scale;
    const M qmin = static_cast<M>(a.cfg.qmin), qmax = static_cast<M>(a.cfg.qmax);
    O* out = y + q * a.len;
    uint32_t* words = mask + q * (a.len / 32);
    for (int64_t i = lane, w = 0; i < a.len; i += 32, ++w) {
      const qmath::FakeQuantResult<M> r =
          dfq::fake_quant_element<kFloatZero>(to_math(g[i]), p, inv, qmin, qmax, a.cfg);
      out[i] = narrow_out<T, O>(r.y);
      const uint32_t bits = __ballot_sync(0xffffffffu, r.in_range);
      if (lane == 0) words[w] = bits;
    }
  }
}

// One pack read through the read-only path as whole 16-byte loads (a pack handed on by
// reference is otherwise read element by element). p: 16-byte aligned.
template <typename T>
__device__ __forceinline__ Pack8<T> load16(const Pack8<T>* p) {
  static_assert(sizeof(Pack8<T>) % 16 == 0, "whole 16-byte words");
  Pack8<T> v;
  const uint4* src = reinterpret_cast<const uint4*>(p);
  uint4* dst = reinterpret_cast<uint4*>(&v);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(Pack8<T>) / 16); ++k) dst[k] = __ldg(src + k);
  return v;
}

// Eight results narrowed to O, two to an instruction for 16-bit O; round to nearest even, as
// from_math narrows a number.
template <typename O>
__device__ __forceinline__ Pack8<O> narrow_pack_fast(const float (&y)[8]) {
  Pack8<O> r;
  if constexpr (std::is_same_v<O, __nv_bfloat16>) {
    __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(r.v);
#pragma unroll
    for (int k = 0; k < 4; ++k) r2[k] = __floats2bfloat162_rn(y[2 * k], y[2 * k + 1]);
  } else if constexpr (std::is_same_v<O, __half>) {
    __half2* r2 = reinterpret_cast<__half2*>(r.v);
#pragma unroll
    for (int k = 0; k < 4; ++k) r2[k] = __floats2half2_rn(y[2 * k], y[2 * k + 1]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) r.v[j] = static_cast<O>(y[j]);
  }
  return r;
}

// qmath::fake_quant of a pack in an integer mode, for groups whose x and q are all numbers
// (a valid group with a finite 1/scale): no NaN test and no NaN-preserving narrowing, about a
// third of the general rule's instructions an element (the kernel is bound by instructions
// on 16-bit rows, not by memory). For numbers each step equals qmath::fake_quant's:
// fmin/fmax is its clamp, the clamped code equals q exactly when q was in range, and
// narrow_pack_fast rounds as from_math does.
template <typename T, typename O>
__device__ __forceinline__ Pack8<O> fake_quant_pack_fast(const Pack8<T>& v, float scale, float zp,
                                                         float inv, float qmin, float qmax,
                                                         uint32_t& bits) {
  static_assert(std::is_same_v<math_of<T>, float>, "f32 math only");
  float y[8];
  bits = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float q = qmath::round_even(to_math(v.v[j]) * inv) + zp;
    const float c = fminf(fmaxf(q, qmin), qmax);
    bits |= static_cast<uint32_t>(c == q) << j;
    y[j] = (c - zp) * scale;
  }
  return narrow_pack_fast<O>(y);
}

// kTeam lanes per group (a power of two); lane m of a team takes packs m, m + kTeam, ... of
// its group. The loop over groups is uniform per warp (a team past the last group computes on
// zeros and stores nothing) so the team shuffles always see the whole warp.
template <typename T, typename O, int kTeam, bool kFloatZero>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    team_kernel(const T* __restrict__ x, O* __restrict__ y, uint8_t* __restrict__ mask,
                float* __restrict__ scale, void* __restrict__ zp, LaunchArgs a) {
  using M = math_of<T>;
  constexpr int kTeamsPerWarp = 32 / kTeam;
  const int lane = threadIdx.x & 31, member = lane % kTeam;
  const int64_t packs = a.len / 8;
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t stride = int64_t{gridDim.x} * kWarpsPerBlock * kTeamsPerWarp;
  for (int64_t base = warp * kTeamsPerWarp; base < a.groups; base += stride) {
    const int64_t q = base + lane / kTeam;
    const bool active = q < a.groups;
    const Pack8<T>* g = reinterpret_cast<const Pack8<T>*>(x + (active ? q : 0) * a.len);
    // The integer modes may start from 0 (their qparams take min(min, 0) and max(max, 0));
    // float_zero's range is the group's own, so it starts from +-infinity.
    // (The payload of a NaN and the sign of a zero, which PackMinMax may change, reach no
    // qparam: a NaN makes the scale NaN, and each mode's range formula cannot see a zero's
    // sign; dynamic_fake_quantize_math.h.)
    PackMinMax<T> range(kFloatZero ? M(INFINITY) : M(0), kFloatZero ? M(-INFINITY) : M(0));
    if (active) {
#pragma unroll 4
      for (int64_t p = member; p < packs; p += kTeam) range.add(load16(g + p));
    }
    const M mn = team_reduce(range.min(), kTeam, [](M l, M r) { return nan_min(l, r); });
    const M mx = team_reduce(range.max(), kTeam, [](M l, M r) { return nan_max(l, r); });
    if (!active) continue;
    const dfq::QParams<M> p = dfq::qparams(mn, mx, a.cfg);
    if (member == 0) {
      if (!p.valid) report_device_error(a.err, kBadScale, a.node, q, static_cast<double>(p.scale));
      scale[q] = static_cast<float>(p.scale);
      store_zero_point<kFloatZero>(zp, q, p.zero_point);
    }
    const M inv = M(1) / p.scale;
    const M qmin = static_cast<M>(a.cfg.qmin), qmax = static_cast<M>(a.cfg.qmax);
    Pack8<O>* out = reinterpret_cast<Pack8<O>*>(y + q * a.len);
    uint8_t* bytes = mask + q * packs;
    if (!kFloatZero && p.valid && qmath::is_finite(inv)) {
      // A valid group holds no NaN or infinity, and a finite 1/scale keeps every x * inv
      // a number, so the element rule needs no NaN test: fake_quant_pack_fast.
#pragma unroll 2
      for (int64_t i = member; i < packs; i += kTeam) {
        uint32_t bits;
        out[i] =
            fake_quant_pack_fast<T, O>(load16(g + i), p.scale, p.zero_point, inv, qmin, qmax, bits);
        bytes[i] = static_cast<uint8_t>(bits);
      }
      continue;
    }
#pragma unroll 2
    for (int64_t i = member; i < packs; i += kTeam) {
      const Pack8<T> v = g[i];
      Pack8<O> r;
      uint32_t bits = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const qmath::FakeQuantResult<M> f =
            dfq::fake_quant_element<kFloatZero>(to_math(v.v[j]), p, inv, qmin, qmax, a.cfg);
        // The select form: the same bits as from_math without a branch per element.
        r.v[j] = narrow_out<T, O>(f.y);
        bits |= static_cast<uint32_t>(f.in_range) << j;
      }
      out[i] = r;
      bytes[i] = static_cast<uint8_t>(bits);
    }
  }
}

template <typename T, typename O, int kTeam>
void launch_team(const Tensor& x, KernelContext& ctx, const LaunchArgs& a, cudaStream_t stream) {
  constexpr int64_t kGroupsPerBlock = kWarpsPerBlock * (32 / kTeam);
  const int64_t blocks = std::min<int64_t>((a.groups + kGroupsPerBlock - 1) / kGroupsPerBlock,
                                           int64_t{32} * multiprocessor_count());
  auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
        in_ptr<T>(x), out_ptr<O>(ctx.outputs[0]), out_ptr<uint8_t>(ctx.outputs[1]),
        out_ptr<float>(ctx.outputs[2]), ctx.outputs[3].raw_data(), a);
  };
  if (a.cfg.mode == dfq::Mode::float_zero)
    launch(team_kernel<T, O, kTeam, true>);
  else
    launch(team_kernel<T, O, kTeam, false>);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

// team_kernel for T when it applies: the smallest power-of-two team (4 to 32) covering a
// group's packs. False leaves the launch to group_kernel.
template <typename T, typename O>
bool try_team_kernel(const Tensor& x, KernelContext& ctx, const LaunchArgs& a,
                     cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    return false;  // f64 keeps the warp kernel (an 8-element pack is four 16-byte loads)
  } else {
    if (a.len % 8 != 0 || !aligned16(x.raw_data()) || !aligned16(ctx.outputs[0].raw_data()))
      return false;
    const int64_t packs = a.len / 8;
    if (packs <= 4)
      launch_team<T, O, 4>(x, ctx, a, stream);
    else if (packs <= 8)
      launch_team<T, O, 8>(x, ctx, a, stream);
    else if (packs <= 16)
      launch_team<T, O, 16>(x, ctx, a, stream);
    else
      launch_team<T, O, 32>(x, ctx, a, stream);
    return true;
  }
}

// y and the mask for group lengths that split mask words: one thread per mask byte. zp: the
// i32 zero points (integer modes); zero: float_zero's zeros in the math type.
template <typename T, typename O, bool kFloatZero>
__global__ void byte_kernel(const T* __restrict__ x, O* __restrict__ y, uint8_t* __restrict__ mask,
                            const math_of<T>* __restrict__ scale, const int32_t* __restrict__ zp,
                            const math_of<T>* __restrict__ zero, int64_t n, LaunchArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.cfg.qmin), qmax = static_cast<M>(a.cfg.qmax);
  for (int64_t b = global_thread(); b * 8 < n; b += global_stride()) {
    uint8_t bits = 0;
    for (int64_t i = b * 8; i < n && i < b * 8 + 8; ++i) {
      const int64_t q = i / a.len;
      dfq::QParams<M> p{scale[q], M(0), true};
      if constexpr (kFloatZero) {
        p.zero_point = zero[q];
        p.low = dfq::float_zero_low(p.scale, p.zero_point, a.cfg);
      } else {
        p.zero_point = static_cast<M>(zp[q]);
      }
      const qmath::FakeQuantResult<M> r =
          dfq::fake_quant_element<kFloatZero>(to_math(x[i]), p, M(1) / p.scale, qmin, qmax, a.cfg);
      y[i] = narrow_out<T, O>(r.y);
      if (r.in_range) bits |= static_cast<uint8_t>(1u << (i - b * 8));
    }
    mask[b] = bits;
  }
}

template <typename T, typename O>
void launch_typed(KernelContext& ctx, const LaunchArgs& a, cudaStream_t stream) {
  const DynamicFakeQuantizeArgs& p = ctx.args<DynamicFakeQuantizeArgs>();
  const Tensor& x = ctx.inputs[0];
  const int64_t n = x.numel();
  {
    if (try_team_kernel<T, O>(x, ctx, a, stream)) return;
    const int64_t blocks = std::min<int64_t>((p.groups + kWarpsPerBlock - 1) / kWarpsPerBlock,
                                             int64_t{32} * multiprocessor_count());
    using M = math_of<T>;
    const bool float_zero = a.cfg.mode == dfq::Mode::float_zero;
    // Mask words split by groups: byte_kernel quantizes from the scales (and float_zero's
    // zeros) in the math type: the f32 outputs themselves, or f64 copies group_kernel writes.
    Tensor copies;
    M *scale_m = nullptr, *zero_m = nullptr, *copy_scale = nullptr, *copy_zero = nullptr;
    if (!a.quantize) {
      if constexpr (std::is_same_v<M, float>) {
        scale_m = out_ptr<float>(ctx.outputs[2]);
        if (float_zero) zero_m = out_ptr<float>(ctx.outputs[3]);
      } else {
        copies = Tensor::empty({2, p.groups}, DType::f64, x.device());
        scale_m = copy_scale = out_ptr<double>(copies);
        zero_m = copy_zero = copy_scale + p.groups;
      }
    }
    auto groups = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
          in_ptr<T>(x), out_ptr<O>(ctx.outputs[0]), out_ptr<uint32_t>(ctx.outputs[1]),
          out_ptr<float>(ctx.outputs[2]), ctx.outputs[3].raw_data(), copy_scale, copy_zero, a);
    };
    if (float_zero)
      groups(group_kernel<T, O, true>);
    else
      groups(group_kernel<T, O, false>);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    if (a.quantize) return;
    auto shape = elementwise_launch((n + 7) / 8);
    const int32_t* zp = float_zero ? nullptr : in_ptr<int32_t>(ctx.outputs[3]);
    auto bytes = [&](auto kernel) {
      kernel<<<shape.blocks, shape.threads, 0, stream>>>(in_ptr<T>(x), out_ptr<O>(ctx.outputs[0]),
                                                         out_ptr<uint8_t>(ctx.outputs[1]), scale_m,
                                                         zp, zero_m, n, a);
    };
    if (float_zero)
      bytes(byte_kernel<T, O, true>);
    else
      bytes(byte_kernel<T, O, false>);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
}

void dynamic_fake_quantize_cuda(KernelContext& ctx) {
  const DynamicFakeQuantizeArgs& p = ctx.args<DynamicFakeQuantizeArgs>();
  const Tensor& x = ctx.inputs[0];
  if (x.numel() == 0 || p.groups == 0) return;
  LaunchArgs a{p.groups, p.group_len, p.config, p.group_len % 32 == 0, error_record(ctx.device),
               ctx.site};
  cudaStream_t stream = cuda_stream(ctx.device);
  if (x.dtype() == DType::f32 && p.out == DType::bf16)
    return launch_typed<float, __nv_bfloat16>(ctx, a, stream);
  if (x.dtype() == DType::f32 && p.out == DType::f16)
    return launch_typed<float, __half>(ctx, a, stream);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    launch_typed<T, T>(ctx, a, stream);
  });
}

}  // namespace

void add_dynamic_fake_quantize_cuda_kernels(OpRegistry& r) {
  r.get_mutable("dynamic_fake_quantize")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, dynamic_fake_quantize_cuda});
}

}  // namespace qg
