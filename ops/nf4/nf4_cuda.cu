// CUDA kernels of the NF4 family, with the shared nf4_math.h element math and INT4's
// packing helpers, so codes, absmax values and bytes match the CPU bit for bit.
// - nf4_quantize_pack: for contiguous whole groups (the default last-axis layout with
//   axis_len % group_size == 0, group_size % 8 == 0) one pass (ops/int4/group_pack.cuh):
//   groups held in registers, absmax by team shuffles, 8 codes per 4-byte store. Otherwise
//   one thread per group computes its absmax (exact in any order), then one thread per
//   output byte encodes both of its elements (no atomics, pad nibble 0).
// - nf4_unpack_dequantize: one thread per element, a single rounding to the output dtype.
// - nf4_double_quantize / nf4_double_dequantize: one thread per block of absmax values.
// Invalid absmax values are recorded in the device error buffer and raised at run end.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/int4/group_pack.cuh"
#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_math.h"
#include "ops/int4/packed_args.h"
#include "ops/nf4/nf4_math.h"

namespace qg {
namespace {

using namespace cuda;

// The f32 bucket table of Nf4Codec::encode, filled by Nf4Codec::setup in every block.
__shared__ float g_nf4_thr[64];
__shared__ uint8_t g_nf4_base[64];

// The NF4 statistics (absmax over finite values) and encoding for group_pack_kernel. The
// reciprocal is taken as the CPU takes it: 1 / 0 = inf for an all-zero group, whose codes
// then come from NaN (0 * inf) and are the 0.0 code.
template <typename M>
struct Nf4Codec {
  static constexpr int kMaxPacksPerLane = 2;
  static constexpr int kMaxPacksPerLane16 = 2;
  static constexpr bool kPipelined = true;
  static constexpr bool kPairStats = false;
  static constexpr bool kFiniteFastPath = false;
  static constexpr int kMinBlocksPerSm = 4;
  static constexpr int kMinBlocksPerSm16 = 4;
  M* absmax;
  struct Stats {
    M amax;
  };
  struct Params {
    M inv;
  };
  __device__ Stats init() const { return {M(0)}; }
  // Branch-free: non-finite values become NaN, which fmax skips; |-0.0| is +0.0, so the
  // absmax is the CPU's bit for bit (never -0.0).
  __device__ Stats add(Stats s, M v) const {
    const M w = finite_or_nan(v);
    return {fmax_of(s.amax, fabs(w))};
  }
  __device__ Stats reduce(Stats s, int team) const {
    return {team_reduce(s.amax, team, [](M a, M b) { return max_of(a, b); })};
  }
  __device__ Params params(const Stats& s, int64_t q, bool write) const {
    if (write) absmax[q] = s.amax;
    return {M(1) / s.amax};
  }
  // f32: nf4::encode's count of midpoints below v = x * inv from a 64-bucket table. Bucket
  // b = rint(clamp(v, -1, 1) * 32 + 32) covers v in [(b - 32.5) / 32, (b - 31.5) / 32];
  // midpoints are >= 0.08 apart, so at most one lies in a bucket (widened by 1e-4):
  // base[b] counts the midpoints below the bucket and thr[b] is the next one (+inf after
  // the last), so the count is base[b] + [thr[b] < v]. Checked against nf4::encode for
  // every f32 v (all 2^32 bit patterns). f64 uses encode_search.
  __device__ void setup() {
    if constexpr (std::is_same_v<M, float>) {
      for (int b = threadIdx.x; b < 64; b += blockDim.x) {
        const float lo = (static_cast<float>(b) - 32.5f) / 32.0f - 1e-4f;
        int c = 0;
        while (c < 15 && nf4::midpoint<float>(c) < lo) ++c;
        g_nf4_base[b] = static_cast<uint8_t>(c);
        g_nf4_thr[b] = c < 15 ? nf4::midpoint<float>(c) : INFINITY;
      }
      __syncthreads();
    }
  }
  __device__ uint8_t encode(M x, const Params& p) const {
    if constexpr (std::is_same_v<M, float>) {
      const float v = x * p.inv;
      const float t = fmaf(fminf(fmaxf(v, -1.0f), 1.0f), 32.0f, 12582944.0f);  // 1.5 * 2^23 + 32
      const int b = min(__float_as_int(t) - 0x4B400000, 63);                   // - 1.5 * 2^23
      const int code = g_nf4_base[b] + (g_nf4_thr[b] < v ? 1 : 0);
      return static_cast<uint8_t>(qmath::is_nan(v) ? nf4::kZeroCode : code);
    } else {
      return encode_search(x, p);
    }
  }
  // The count as a 4-step branch-free binary search over the 15 increasing midpoints:
  // 8 * [m7 < v] + 4 * [m(c+3) < v] + 2 * [m(c+1) < v] + [m(c) < v], c the count so far.
  // A NaN v fails every comparison and takes the 0.0 code, as in encode.
  __device__ uint8_t encode_search(M x, const Params& p) const {
    const M v = x * p.inv;
    auto m = [](int i) { return nf4::midpoint<M>(i); };
    const bool b3 = m(7) < v;
    const bool b2 = (b3 ? m(11) : m(3)) < v;
    const bool b1 = (b3 ? (b2 ? m(13) : m(9)) : (b2 ? m(5) : m(1))) < v;
    const M t0 = b3 ? (b2 ? (b1 ? m(14) : m(12)) : (b1 ? m(10) : m(8)))
                    : (b2 ? (b1 ? m(6) : m(4)) : (b1 ? m(2) : m(0)));
    const bool b0 = t0 < v;
    const int code = (b3 ? 8 : 0) + (b2 ? 4 : 0) + (b1 ? 2 : 0) + (b0 ? 1 : 0);
    return static_cast<uint8_t>(qmath::is_nan(v) ? nf4::kZeroCode : code);
  }
};

template <typename T>
__global__ void absmax_kernel(const T* x, ScopeDims d, math_of<T>* absmax) {
  using M = math_of<T>;
  for (int64_t q = global_thread(); q < d.num_qparams; q += global_stride()) {
    M amax = M(0);
    for (int64_t r = 0; r < d.group_size; ++r) {
      int64_t k;
      if (!scope_element(d, q, r, k)) break;
      M v = to_math(x[k]);
      if (!qmath::is_finite(v)) continue;
      M av = v < M(0) ? -v : v;
      amax = av > amax ? av : amax;
    }
    absmax[q] = amax;
  }
}

template <typename T>
__global__ void nf4_pack_kernel(const T* x, ScopeDims d, int64_t n, bool high_first,
                                const math_of<T>* absmax, uint8_t* packed) {
  using M = math_of<T>;
  for (int64_t b = global_thread(); b < (n + 1) / 2; b += global_stride()) {
    uint8_t byte = 0;
    for (int64_t k = 2 * b; k < 2 * b + 2 && k < n; ++k) {
      const M inv = M(1) / absmax[qparam_of(d, k)];
      byte |= static_cast<uint8_t>(nf4::encode<M>(to_math(x[k]), inv)
                                   << int4::nibble_shift(k, high_first));
    }
    packed[b] = byte;
  }
}

template <typename S, typename T>
__global__ void nf4_unpack_kernel(const uint8_t* packed, const S* absmax, T* y, ScopeDims d,
                                  int64_t n, bool high_first, DeviceErrorRecord* err,
                                  int32_t node) {
  for (int64_t k = global_thread(); k < n; k += global_stride()) {
    int64_t q = qparam_of(d, k);
    S m = absmax[q];
    if (!(qmath::is_finite(m) && m >= S(0)))
      report_device_error(err, kBadAbsmax, node, q, static_cast<double>(m));
    y[k] = narrow_to<T>(nf4::decode<S>(int4::get_code(packed, k, high_first), m));
  }
}

template <typename M>
__global__ void double_quantize_kernel(const M* a, int64_t n, int64_t bs, uint8_t* code, M* scale,
                                       M* mins, DeviceErrorRecord* err, int32_t node) {
  for (int64_t b = global_thread(); b * bs < n; b += global_stride()) {
    int64_t e = n < (b + 1) * bs ? n : (b + 1) * bs;
    M mn = a[b * bs], mx = a[b * bs];
    for (int64_t j = b * bs; j < e; ++j) {
      if (!(qmath::is_finite(a[j]) && a[j] >= M(0)))
        report_device_error(err, kBadAbsmax, node, j, static_cast<double>(a[j]));
      mn = a[j] < mn ? a[j] : mn;
      mx = a[j] > mx ? a[j] : mx;
    }
    const auto p = nf4::block_params<M>(mn, mx);
    scale[b] = p.scale;
    mins[b] = p.min;
    for (int64_t j = b * bs; j < e; ++j) code[j] = nf4::block_encode<M>(a[j], p);
  }
}

template <typename M>
__global__ void double_dequantize_kernel(const uint8_t* code, const M* scale, const M* mins,
                                         int64_t n, int64_t bs, M* out) {
  for (int64_t j = global_thread(); j < n; j += global_stride())
    out[j] = nf4::block_decode<M>(code[j], scale[j / bs], mins[j / bs]);
}

void quantize_pack_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const PackedArgs& args = ctx.args<PackedArgs>();
  const ScopeLayout& l = args.layout;
  ScopeDims d = scope_dims(l);
  bool high_first = args.high_first;
  auto s = cuda_stream(ctx.device);
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    using T = decltype(tag);
    using M = math_of<T>;
    if (launch_group_pack(l, in_ptr<T>(x), out_ptr<uint8_t>(ctx.outputs[0]), high_first,
                          Nf4Codec<M>{out_ptr<M>(ctx.outputs[1])}, s)) {
      QG_CUDA_CHECK_LAUNCH(ctx.op);
      return;
    }
    if (d.num_qparams > 0) {
      auto shape = elementwise_launch(d.num_qparams, 128);
      absmax_kernel<T>
          <<<shape.blocks, shape.threads, 0, s>>>(in_ptr<T>(x), d, out_ptr<M>(ctx.outputs[1]));
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    }
    if (x.numel() == 0) return;
    auto shape = elementwise_launch((x.numel() + 1) / 2);
    nf4_pack_kernel<T><<<shape.blocks, shape.threads, 0, s>>>(in_ptr<T>(x), d, x.numel(),
                                                              high_first, in_ptr<M>(ctx.outputs[1]),
                                                              out_ptr<uint8_t>(ctx.outputs[0]));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

void unpack_dequantize_cuda(KernelContext& ctx) {
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return;
  const PackedArgs& args = ctx.args<PackedArgs>();
  ScopeDims d = scope_dims(args.layout);
  bool high_first = args.high_first;
  auto shape = elementwise_launch(y.numel());
  auto st = cuda_stream(ctx.device);
  dispatch_float(y.dtype(), ctx.op, [&](auto ttag) {
    using T = decltype(ttag);
    auto launch = [&](auto stag) {
      using S = decltype(stag);
      nf4_unpack_kernel<S, T><<<shape.blocks, shape.threads, 0, st>>>(
          in_ptr<uint8_t>(ctx.inputs[0]), in_ptr<S>(ctx.inputs[1]), out_ptr<T>(y), d, y.numel(),
          high_first, error_record(ctx.device), ctx.site);
    };
    if (ctx.inputs[1].dtype() == DType::f64)
      launch(double{});
    else
      launch(float{});
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  });
}

template <typename Fn>
void dispatch_f32_f64(DType d, Fn&& fn) {
  if (d == DType::f64)
    fn(double{});
  else
    fn(float{});
}

void double_quantize_cuda(KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  int64_t n = a.numel(), bs = ctx.args<BlockArgs>().block_size;
  if (n == 0) return;
  auto shape = elementwise_launch((n + bs - 1) / bs, 128);
  dispatch_f32_f64(a.dtype(), [&](auto tag) {
    using M = decltype(tag);
    double_quantize_kernel<M><<<shape.blocks, shape.threads, 0, cuda_stream(ctx.device)>>>(
        in_ptr<M>(a), n, bs, out_ptr<uint8_t>(ctx.outputs[0]), out_ptr<M>(ctx.outputs[1]),
        out_ptr<M>(ctx.outputs[2]), error_record(ctx.device), ctx.site);
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void double_dequantize_cuda(KernelContext& ctx) {
  int64_t n = ctx.inputs[0].numel(), bs = ctx.args<BlockArgs>().block_size;
  if (n == 0) return;
  auto shape = elementwise_launch(n);
  dispatch_f32_f64(ctx.inputs[1].dtype(), [&](auto tag) {
    using M = decltype(tag);
    double_dequantize_kernel<M><<<shape.blocks, shape.threads, 0, cuda_stream(ctx.device)>>>(
        in_ptr<uint8_t>(ctx.inputs[0]), in_ptr<M>(ctx.inputs[1]), in_ptr<M>(ctx.inputs[2]), n, bs,
        out_ptr<M>(ctx.outputs[0]));
  });
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_nf4_cuda_kernels(OpRegistry& r) {
  r.get_mutable("nf4_quantize_pack")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, quantize_pack_cuda});
  r.get_mutable("nf4_unpack_dequantize")
      .kernels.push_back({DeviceType::cuda, {DType::u8}, unpack_dequantize_cuda});
  r.get_mutable("nf4_double_quantize")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, double_quantize_cuda});
  r.get_mutable("nf4_double_dequantize")
      .kernels.push_back({DeviceType::cuda, {DType::u8}, double_dequantize_cuda});
}

}  // namespace qg
