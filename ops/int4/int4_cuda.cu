// CUDA kernels for int4_quantize_pack and int4_unpack_dequantize.
// Quantize-pack: when the groups are contiguous and whole (the default last-axis layout
// with axis_len % group_size == 0 and group_size % 8 == 0), one pass (group_pack.cuh): a
// team of lanes holds each group in registers, reduces its range with shuffles, derives the
// parameters with the shared int4::symmetric_params / asymmetric_params and writes 8 codes
// per 4-byte store. Otherwise two launches: one thread per group computes the group's
// range and parameters, then one thread per output byte encodes its two elements with
// int4::encode and writes the whole byte (pad nibble 0), so no atomics are needed even when
// a byte straddles two groups. min/max/absmax are exact in any order, so both paths give
// the CPU's codes, scales and bytes.
// Unpack-dequantize is one thread per element with int4::decode and a single rounding to the
// output dtype (as the CPU's narrow_cast). Bad qparams are recorded in the device error
// buffer and raised at the end of the run.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/int4/group_pack.cuh"
#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_math.h"
#include "ops/int4/packed_args.h"

namespace qg {
namespace {

using namespace cuda;

// The INT4 statistics and encoding for group_pack_kernel; kSymmetric needs only absmax.
template <typename M, bool kSymmetric>
struct Int4Codec {
  static constexpr int kMaxPacksPerLane = 4;
  // 16-bit types: 4 packs per lane as well (g128: 4 lanes per group). Measured on an H100,
  // bf16[8192, 4096]: 8 packs per lane (2 lanes) 39.7 us = 0.82x copy, 4 packs 32.5 us =
  // 0.66x, same binary, same run.
  static constexpr int kMaxPacksPerLane16 = 4;
  static constexpr bool kPipelined = false;
  static constexpr bool kPairStats = true;
  // f32 math: 4 blocks of 256 (at most 64 registers; the full 8-pack kernels would take 80
  // and leave 3). f64 keeps 3: at 64 registers it spills.
  static constexpr int kMinBlocksPerSm = std::is_same_v<M, float> ? 4 : 3;
  // 16-bit types: 6 blocks of 256 (at most 40 registers). The kernel is not issue-bound
  // alone: at 4 blocks per SM (56 registers) it ran at 0.72x copy (H200, bf16[8192, 4096])
  // issuing ~12.4 instructions per element, about half the SM's issue rate, because a lane
  // holds only 64 bytes in flight (4 x 16-byte packs, between its loads and its first use),
  // so 4 blocks kept at most 64 KiB per SM in flight, half what the f32 path keeps. One
  // round per block and no per-pack validity branches fit it in 40 registers: 6 blocks,
  // 96 KiB in flight.
  static constexpr int kMinBlocksPerSm16 = 6;
  M* scale;
  uint8_t* zp;
  struct Stats {
    M mn, mx, amax;
  };
  struct Params {
    M inv_scale, zpm;
    int32_t zp;
  };
  __device__ void setup() {}
  __device__ Stats init() const {
    return {static_cast<M>(INFINITY), static_cast<M>(-INFINITY), M(0)};
  }
  // Branch-free: non-finite values become NaN, which fmin/fmax skip. |v| is taken with
  // fabs, so a -0.0 counts as +0.0 and the absmax is the CPU's.
  __device__ Stats add(Stats s, M v) const {
    M w;
    if constexpr (std::is_same_v<M, float>)
      w = finite_or_nan_fma(v);
    else
      w = finite_or_nan(v);
    if (!kSymmetric) {
      s.mn = fmin_of(s.mn, w);
      s.mx = fmax_of(s.mx, w);
    }
    s.amax = fmax_of(s.amax, fabs(w));
    return s;
  }
  // The same statistics of a 16-bit type, half-wise on words of two elements (exact, as
  // min / max are). Both modes fold the finite min and max (two 3-input HMNMX2 per 4
  // words, where an absmax would need an extra |.| per word); the absmax is then
  // max(|min|, |max|), or 0 when the lane saw no finite value (min > max).
  struct Stats2 {
    uint32_t mn, mx;
  };
  template <typename T>
  __device__ Stats2 init2() const {
    return {pos_inf2<T>(), neg_inf2<T>()};
  }
  template <typename T>
  __device__ Stats2 add2(Stats2 s, uint32_t w) const {
    const uint32_t f = finite_or_nan2<T>(w);
    return {min2<T>(s.mn, f), max2<T>(s.mx, f)};
  }
  template <typename T>
  __device__ Stats fold2(const Stats2& s) const {
    const float mn = fminf(low_as_float<T>(s.mn), high_as_float<T>(s.mn));
    const float mx = fmaxf(low_as_float<T>(s.mx), high_as_float<T>(s.mx));
    return {mn, mx, mn <= mx ? fmaxf(fabsf(mn), fabsf(mx)) : 0.0f};
  }
  // Groups without +/-Inf (f32 math): the kernel takes the statistics without the finite
  // filter and, when no lane of the warp saw +/-Inf, encodes with encode_finite.
  static constexpr bool kFiniteFastPath = std::is_same_v<M, float>;
  __device__ Stats add_any(Stats s, M v) const {
    if (!kSymmetric) {
      s.mn = fmin_of(s.mn, v);
      s.mx = fmax_of(s.mx, v);
    }
    s.amax = fmax_of(s.amax, fabs(v));
    return s;
  }
  template <typename T>
  __device__ Stats2 add2_any(Stats2 s, uint32_t w) const {
    return {min2<T>(s.mn, w), max2<T>(s.mx, w)};
  }
  // The absmax (symmetric) or min / max (asymmetric) of add_any / add2_any + fold2 is
  // infinite exactly when a +/-Inf was taken (the empty min / max are +Inf / -Inf, the
  // wrong way round, and the empty absmax is 0).
  __device__ bool saw_inf(const Stats& s) const {
    if constexpr (kSymmetric)
      return s.amax == static_cast<M>(INFINITY);
    else
      return s.mn == static_cast<M>(-INFINITY) || s.mx == static_cast<M>(INFINITY);
  }
  // The code of a finite x (or NaN) of a group without +/-Inf, less the nibble of
  // finite_bias: the clamps of encode that cannot bind are left out (CPU check of these
  // bounds: tests/ops_int4/int4_code_range_test.cpp). r = rint(y), y = x * inv (the f32
  // product encode takes; the same cvt, so NaN gives r = 0 and the code zp as in encode):
  //  - symmetric: |r| <= 7, so the code is r + 8 with no clamp (bias 8 in every nibble).
  //    Either finish_params kept scale = fl(absmax / 7) > 0 with inv = fl(1 / scale)
  //    finite: inv is then normal, and scale, even subnormal, is >= 2^-128 and within
  //    2^-22 (relative) of absmax / 7, so |y| <= fl(absmax * inv) <= 7 * (1 + 2^-24) /
  //    (1 - 2^-22) < 7.5; or it set scale = inv = 1, which needs absmax / 7 <= 2^-128
  //    (or absmax = 0), so |y| = |x| <= absmax < 0.5.
  //  - asymmetric: r + zp >= 0 and |y| < 16, so only the clamp to 15 remains (one
  //    VIADDMNMX, which cannot overflow). min' = min(min, 0) <= x and inv >= 0, so y >=
  //    fl(min' * inv) = -fl(-min' * inv); zp is rint(fl(-min' * inv)) unclamped (0 <=
  //    -min', max' <= R = fl(max' - min'), and R * inv <= 15 * (1 + 2^-24) / (1 - 2^-22)
  //    < 15.5 as above; R = inf gives inv = 0, the degenerate ranges inv = 1 with -min',
  //    max' < 0.5), and rint is monotone and odd, so rint(y) >= -zp.
  __device__ uint32_t encode_finite(M x, const Params& p) const {
    const int32_t r = rint_sat_s16(x * p.inv_scale);
    if constexpr (kSymmetric)
      return static_cast<uint32_t>(r);
    else
      return static_cast<uint32_t>(min(r + p.zp, 15));
  }
  __device__ uint32_t finite_bias(const Params&) const { return kSymmetric ? 0x88888888u : 0u; }
  // No statistic is NaN (add / fold2 skip NaN), so fmin / fmax (one FMNMX) equal min_of /
  // max_of up to the sign of a zero, which the params cannot see (see min_of).
  __device__ Stats reduce(Stats s, int team) const {
    if (!kSymmetric) {
      s.mn = team_reduce(s.mn, team, [](M a, M b) { return fmin_of(a, b); });
      s.mx = team_reduce(s.mx, team, [](M a, M b) { return fmax_of(a, b); });
    } else {
      s.amax = team_reduce(s.amax, team, [](M a, M b) { return fmax_of(a, b); });
    }
    return s;
  }
  __device__ Params params(const Stats& s, int64_t q, bool write) const {
    auto p =
        kSymmetric ? int4::symmetric_params<M>(s.amax) : int4::asymmetric_params<M>(s.mn, s.mx);
    if (write) {
      scale[q] = p.scale;
      zp[q] = static_cast<uint8_t>(p.zero_point);
    }
    return {p.inv_scale, p.zero_point, static_cast<int32_t>(p.zero_point)};
  }
  // int4::encode: f32 through code_of (same codes, see cuda_rows.cuh: clamp(rint(x * inv) +
  // zp, 0, 15), NaN -> zp); f64 with a select for NaN instead of an early return.
  __device__ uint32_t encode(M x, const Params& p) const {
    if constexpr (std::is_same_v<M, float>) {
      return static_cast<uint32_t>(code_of(x * p.inv_scale, p.zp, 0, 15));
    } else {
      const M q = qmath::round_even(x * p.inv_scale) + p.zpm;
      const M c = qmath::clamp(q, M(0), M(15));
      return static_cast<uint32_t>(qmath::is_nan(x) ? p.zpm : c);
    }
  }
};

template <typename T>
__global__ void group_params_kernel(const T* x, ScopeDims d, bool symmetric, math_of<T>* scale,
                                    uint8_t* zp, math_of<T>* inv, math_of<T>* zpm) {
  using M = math_of<T>;
  for (int64_t q = global_thread(); q < d.num_qparams; q += global_stride()) {
    M mn = static_cast<M>(INFINITY), mx = static_cast<M>(-INFINITY), amax = M(0);
    for (int64_t r = 0; r < d.group_size; ++r) {
      int64_t k;
      if (!scope_element(d, q, r, k)) break;
      M v = to_math(x[k]);
      if (!qmath::is_finite(v)) continue;
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
      M av = v < M(0) ? -v : v;
      amax = av > amax ? av : amax;
    }
    auto p = symmetric ? int4::symmetric_params<M>(amax) : int4::asymmetric_params<M>(mn, mx);
    scale[q] = p.scale;
    zp[q] = static_cast<uint8_t>(p.zero_point);
    inv[q] = p.inv_scale;
    zpm[q] = p.zero_point;
  }
}

template <typename T>
__global__ void pack_kernel(const T* x, ScopeDims d, int64_t n, bool high_first,
                            const math_of<T>* scale, const math_of<T>* inv, const math_of<T>* zpm,
                            uint8_t* packed) {
  using M = math_of<T>;
  for (int64_t b = global_thread(); b < (n + 1) / 2; b += global_stride()) {
    uint8_t byte = 0;
    for (int64_t k = 2 * b; k < 2 * b + 2 && k < n; ++k) {
      int64_t q = qparam_of(d, k);
      int4::GroupParams<M> p{scale[q], inv[q], zpm[q]};
      byte |= static_cast<uint8_t>(int4::encode<M>(to_math(x[k]), p)
                                   << int4::nibble_shift(k, high_first));
    }
    packed[b] = byte;
  }
}

template <typename S, typename Z, typename T>
__global__ void unpack_kernel(const uint8_t* packed, const S* scale, const Z* zp, T* y, ScopeDims d,
                              int64_t n, bool high_first, DeviceErrorRecord* err, int32_t node) {
  for (int64_t k = global_thread(); k < n; k += global_stride()) {
    int64_t q = qparam_of(d, k);
    double z = static_cast<double>(zp[q]), s = static_cast<double>(scale[q]);
    if (!(z >= 0 && z <= 15)) report_device_error(err, kBadZeroPoint, node, q, z, 0, 15);
    if (!(qmath::is_finite(s) && s > 0)) report_device_error(err, kBadScale, node, q, s);
    S v = int4::decode<S>(int4::get_code(packed, k, high_first), scale[q], static_cast<S>(z));
    y[k] = narrow_to<T>(v);
  }
}

void quantize_pack_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const PackedArgs& args = ctx.args<PackedArgs>();
  const ScopeLayout& l = args.layout;
  ScopeDims d = scope_dims(l);
  bool symmetric = args.symmetric;
  bool high_first = args.high_first;
  auto s = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    using M = math_of<T>;
    M* scale = out_ptr<M>(ctx.outputs[1]);
    uint8_t* zp = out_ptr<uint8_t>(ctx.outputs[2]);
    uint8_t* packed = out_ptr<uint8_t>(ctx.outputs[0]);
    bool one_pass = symmetric ? launch_group_pack(l, in_ptr<T>(x), packed, high_first,
                                                  Int4Codec<M, true>{scale, zp}, s)
                              : launch_group_pack(l, in_ptr<T>(x), packed, high_first,
                                                  Int4Codec<M, false>{scale, zp}, s);
    if (one_pass) {
      QG_CUDA_CHECK_LAUNCH(ctx.op);
      return;
    }
    DType mdt = sizeof(M) == 8 ? DType::f64 : DType::f32;
    Tensor inv = Tensor::empty({d.num_qparams}, mdt, x.device());
    Tensor zpm = Tensor::empty({d.num_qparams}, mdt, x.device());
    if (d.num_qparams > 0) {
      auto shape = elementwise_launch(d.num_qparams, 128);
      group_params_kernel<T><<<shape.blocks, shape.threads, 0, s>>>(
          in_ptr<T>(x), d, symmetric, out_ptr<M>(ctx.outputs[1]), out_ptr<uint8_t>(ctx.outputs[2]),
          out_ptr<M>(inv), out_ptr<M>(zpm));
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    }
    if (x.numel() == 0) return;
    auto shape = elementwise_launch((x.numel() + 1) / 2);
    pack_kernel<T><<<shape.blocks, shape.threads, 0, s>>>(
        in_ptr<T>(x), d, x.numel(), high_first, in_ptr<M>(ctx.outputs[1]), in_ptr<M>(inv),
        in_ptr<M>(zpm), out_ptr<uint8_t>(ctx.outputs[0]));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void unpack_dequantize_cuda(KernelContext& ctx) {
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return;
  const PackedArgs& args = ctx.args<PackedArgs>();
  const ScopeLayout& l = args.layout;
  bool high_first = args.high_first;
  auto shape = elementwise_launch(y.numel());
  auto st = cuda_stream(ctx.device);
  dispatch_float(y.dtype(), ctx.op, [&](auto ttag) {
    using T = decltype(ttag);
    auto launch = [&](auto stag, auto ztag) {
      using S = decltype(stag);
      using Z = decltype(ztag);
      unpack_kernel<S, Z, T><<<shape.blocks, shape.threads, 0, st>>>(
          in_ptr<uint8_t>(ctx.inputs[0]), in_ptr<S>(ctx.inputs[1]), in_ptr<Z>(ctx.inputs[2]),
          out_ptr<T>(y), scope_dims(l), y.numel(), high_first, error_record(ctx.device), ctx.site);
    };
    bool s64 = ctx.inputs[1].dtype() == DType::f64, z32 = ctx.inputs[2].dtype() == DType::i32;
    if (s64 && z32) launch(double{}, int32_t{});
    if (s64 && !z32) launch(double{}, uint8_t{});
    if (!s64 && z32) launch(float{}, int32_t{});
    if (!s64 && !z32) launch(float{}, uint8_t{});
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

}  // namespace

void add_int4_cuda_kernels(OpRegistry& r) {
  r.get_mutable("int4_quantize_pack")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, quantize_pack_cuda});
  r.get_mutable("int4_unpack_dequantize")
      .kernels.push_back({DeviceType::cuda, {DType::u8}, unpack_dequantize_cuda});
}

}  // namespace qg
