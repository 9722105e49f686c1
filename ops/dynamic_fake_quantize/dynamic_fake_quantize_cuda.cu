// CUDA kernels of dynamic_fake_quantize. One warp per group: the lanes stride through the
// group for its minimum and maximum (NaN wins, as torch.amin / amax), every lane then
// computes the same qparams (dynamic_fake_quantize_math.h, shared with the CPU kernel), lane
// 0 stores them, and a second pass over the group, which the warp has just read and which
// is still in L1, writes y and the mask. So x is read from memory once and nothing waits for
// the host. When a group is a whole number of 32-element mask words (every recipe shape:
// rows of 1024 or 2816, groups of 32 to 256), the warp's 32 in-range bits of each step are
// one aligned mask word; other group lengths leave y and the mask to a per-mask-byte kernel
// reading the stored qparams. Bit-identical to the CPU kernel: the same qparam and element
// math (qmath::fake_quant) in the same math type, y narrowed once.
//
// The common case (f32/f16/bf16, groups a whole number of 8-element packs, 16-byte aligned
// tensors) takes team_kernel instead: a power-of-two team of lanes per group, each lane a
// 16-byte pack of 8 elements per step (one mask byte), several packs in flight per lane. A
// warp per group with 2-byte loads kept about 2 KB in flight per SM, far below what HBM
// needs; packs of 8 give each lane 8x the bytes per load, and teams of 4-16 lanes let short
// weight groups (32-128 elements) fill a warp instead of idling 28 of its lanes.
#include <type_traits>

#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/dynamic_fake_quantize/dynamic_fake_quantize_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kWarpsPerBlock = 8;

template <typename M>
__device__ __forceinline__ M nan_min(M a, M b) {
  return qmath::is_nan(a) ? a : (qmath::is_nan(b) ? b : (b < a ? b : a));
}
template <typename M>
__device__ __forceinline__ M nan_max(M a, M b) {
  return qmath::is_nan(a) ? a : (qmath::is_nan(b) ? b : (b > a ? b : a));
}

struct LaunchArgs {
  int64_t groups, len;
  dfq::Config cfg;
  bool quantize;  // the group length is a whole number of mask words: y and mask here
  DeviceErrorRecord* err;
  int32_t node;
};

// scale_m: the scales in the math type for byte_kernel (f64's would lose bits as f32), or null.
template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    group_kernel(const T* __restrict__ x, T* __restrict__ y, uint32_t* __restrict__ mask,
                 float* __restrict__ scale, int32_t* __restrict__ zp, math_of<T>* scale_m,
                 LaunchArgs a) {
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
      zp[q] = static_cast<int32_t>(p.zero_point);
      if (scale_m != nullptr) scale_m[q] = p.scale;
    }
    if (!a.quantize) continue;
    const M inv = M(1) / p.scale;
    const M qmin = static_cast<M>(a.cfg.qmin), qmax = static_cast<M>(a.cfg.qmax);
    T* out = y + q * a.len;
    uint32_t* words = mask + q * (a.len / 32);
    for (int64_t i = lane, w = 0; i < a.len; i += 32, ++w) {
      const qmath::FakeQuantResult<M> r =
          qmath::fake_quant(to_math(g[i]), inv, p.scale, p.zero_point, qmin, qmax);
      out[i] = from_math<T>(r.y);
      const uint32_t bits = __ballot_sync(0xffffffffu, r.in_range);
      if (lane == 0) words[w] = bits;
    }
  }
}

// kTeam lanes per group (a power of two); lane m of a team takes packs m, m + kTeam, ... of
// its group. The loop over groups is uniform per warp (a team past the last group computes on
// zeros and stores nothing) so the team shuffles always see the whole warp.
template <typename T, int kTeam>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    team_kernel(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask,
                float* __restrict__ scale, int32_t* __restrict__ zp, LaunchArgs a) {
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
    // Starting from 0 changes nothing: the qparams take min(min, 0) and max(max, 0).
    M mn = M(0), mx = M(0);
    if (active) {
#pragma unroll 4
      for (int64_t p = member; p < packs; p += kTeam) {
        const Pack8<T> v = g[p];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const M e = to_math(v.v[j]);
          mn = nan_min(mn, e);
          mx = nan_max(mx, e);
        }
      }
    }
    mn = team_reduce(mn, kTeam, [](M l, M r) { return nan_min(l, r); });
    mx = team_reduce(mx, kTeam, [](M l, M r) { return nan_max(l, r); });
    if (!active) continue;
    const dfq::QParams<M> p = dfq::qparams(mn, mx, a.cfg);
    if (member == 0) {
      if (!p.valid) report_device_error(a.err, kBadScale, a.node, q, static_cast<double>(p.scale));
      scale[q] = static_cast<float>(p.scale);
      zp[q] = static_cast<int32_t>(p.zero_point);
    }
    const M inv = M(1) / p.scale;
    const M qmin = static_cast<M>(a.cfg.qmin), qmax = static_cast<M>(a.cfg.qmax);
    Pack8<T>* out = reinterpret_cast<Pack8<T>*>(y + q * a.len);
    uint8_t* bytes = mask + q * packs;
#pragma unroll 2
    for (int64_t i = member; i < packs; i += kTeam) {
      const Pack8<T> v = g[i];
      Pack8<T> r;
      uint32_t bits = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const qmath::FakeQuantResult<M> f =
            qmath::fake_quant(to_math(v.v[j]), inv, p.scale, p.zero_point, qmin, qmax);
        // The select form: the same bits as from_math without a branch per element.
        r.v[j] = from_math_select<T>(f.y);
        bits |= static_cast<uint32_t>(f.in_range) << j;
      }
      out[i] = r;
      bytes[i] = static_cast<uint8_t>(bits);
    }
  }
}

template <typename T, int kTeam>
void launch_team(const Tensor& x, KernelContext& ctx, const LaunchArgs& a, cudaStream_t stream) {
  constexpr int64_t kGroupsPerBlock = kWarpsPerBlock * (32 / kTeam);
  const int64_t blocks = std::min<int64_t>((a.groups + kGroupsPerBlock - 1) / kGroupsPerBlock,
                                           int64_t{32} * multiprocessor_count());
  team_kernel<T, kTeam><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      in_ptr<T>(x), out_ptr<T>(ctx.outputs[0]), out_ptr<uint8_t>(ctx.outputs[1]),
      out_ptr<float>(ctx.outputs[2]), out_ptr<int32_t>(ctx.outputs[3]), a);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

// team_kernel for T when it applies: the smallest power-of-two team (4 to 32) covering a
// group's packs. False leaves the launch to group_kernel.
template <typename T>
bool try_team_kernel(const Tensor& x, KernelContext& ctx, const LaunchArgs& a,
                     cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    return false;  // f64 keeps the warp kernel (an 8-element pack is four 16-byte loads)
  } else {
    if (a.len % 8 != 0 || !aligned16(x.raw_data()) || !aligned16(ctx.outputs[0].raw_data()))
      return false;
    const int64_t packs = a.len / 8;
    if (packs <= 4)
      launch_team<T, 4>(x, ctx, a, stream);
    else if (packs <= 8)
      launch_team<T, 8>(x, ctx, a, stream);
    else if (packs <= 16)
      launch_team<T, 16>(x, ctx, a, stream);
    else
      launch_team<T, 32>(x, ctx, a, stream);
    return true;
  }
}

// y and the mask for group lengths that split mask words: one thread per mask byte.
template <typename T>
__global__ void byte_kernel(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask,
                            const math_of<T>* __restrict__ scale, const int32_t* __restrict__ zp,
                            int64_t n, LaunchArgs a) {
  using M = math_of<T>;
  const M qmin = static_cast<M>(a.cfg.qmin), qmax = static_cast<M>(a.cfg.qmax);
  for (int64_t b = global_thread(); b * 8 < n; b += global_stride()) {
    uint8_t bits = 0;
    for (int64_t i = b * 8; i < n && i < b * 8 + 8; ++i) {
      const int64_t q = i / a.len;
      const M s = scale[q], z = static_cast<M>(zp[q]);
      const qmath::FakeQuantResult<M> r =
          qmath::fake_quant(to_math(x[i]), M(1) / s, s, z, qmin, qmax);
      y[i] = from_math<T>(r.y);
      if (r.in_range) bits |= static_cast<uint8_t>(1u << (i - b * 8));
    }
    mask[b] = bits;
  }
}

void dynamic_fake_quantize_cuda(KernelContext& ctx) {
  const DynamicFakeQuantizeArgs& p = ctx.args<DynamicFakeQuantizeArgs>();
  const Tensor& x = ctx.inputs[0];
  const int64_t n = x.numel();
  if (n == 0 || p.groups == 0) return;
  LaunchArgs a{p.groups, p.group_len, p.config, p.group_len % 32 == 0, error_record(ctx.device),
               ctx.site};
  cudaStream_t stream = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    if (try_team_kernel<T>(x, ctx, a, stream)) return;
    const int64_t blocks = std::min<int64_t>((p.groups + kWarpsPerBlock - 1) / kWarpsPerBlock,
                                             int64_t{32} * multiprocessor_count());
    using M = math_of<T>;
    // Mask words split by groups: byte_kernel quantizes from the scales in the math type
    // (the f32 scale output itself, or an f64 copy).
    Tensor scale_m;
    M* scale_m_ptr = nullptr;
    if (!a.quantize) {
      if constexpr (std::is_same_v<M, float>) {
        scale_m_ptr = out_ptr<float>(ctx.outputs[2]);
      } else {
        scale_m = Tensor::empty({p.groups}, DType::f64, x.device());
        scale_m_ptr = out_ptr<double>(scale_m);
      }
    }
    group_kernel<T><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
        in_ptr<T>(x), out_ptr<T>(ctx.outputs[0]), out_ptr<uint32_t>(ctx.outputs[1]),
        out_ptr<float>(ctx.outputs[2]), out_ptr<int32_t>(ctx.outputs[3]),
        std::is_same_v<M, float> ? nullptr : scale_m_ptr, a);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    if (a.quantize) return;
    auto shape = elementwise_launch((n + 7) / 8);
    byte_kernel<T><<<shape.blocks, shape.threads, 0, stream>>>(
        in_ptr<T>(x), out_ptr<T>(ctx.outputs[0]), out_ptr<uint8_t>(ctx.outputs[1]), scale_m_ptr,
        in_ptr<int32_t>(ctx.outputs[3]), n, a);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_dynamic_fake_quantize_cuda_kernels(OpRegistry& r) {
  r.get_mutable("dynamic_fake_quantize")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, dynamic_fake_quantize_cuda});
}

}  // namespace qg
