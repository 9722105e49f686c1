// CPU kernels of the NF4 family. Per-element math: nf4_math.h (shared with CUDA); packing:
// ops/int4/int4_math.h. Groups are walked in the [outer, axis_len, inner] view.
#include <algorithm>
#include <cstring>

#include "core/half.h"
#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_cpu_runs.h"
#include "ops/int4/int4_math.h"
#include "ops/int4/narrow_cast.h"
#include "ops/int4/packed_args.h"
#include "ops/nf4/nf4_cpu.h"
#include "ops/nf4/nf4_cpu_runs.h"
#include "ops/nf4/nf4_math.h"

namespace qg {
namespace {

template <typename T>
void quantize_pack_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const Tensor& x = ctx.inputs[0];
  const PackedArgs& args = ctx.args<PackedArgs>();
  const ScopeLayout& l = args.layout;
  const bool high_first = args.high_first;
  const T* px = x.data<T>();
  uint8_t* packed = ctx.outputs[0].data<uint8_t>();
  M* absmax_out = ctx.outputs[1].data<M>();
  // Groups along the last axis are contiguous runs: the loops of int4_cpu_runs.h and
  // nf4_cpu_runs.h, one group at a time while it is in cache. parallel_packed_rows zeroes
  // the packed bytes (nibbles are OR-ed in).
  if (l.inner == 1) {
    parallel_packed_rows(l.outer, l.axis_len, packed, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        for (int64_t g = 0; g < l.num_groups; ++g) {
          const int64_t k0 = o * l.axis_len + g * l.group_size;
          const int64_t n = std::min(l.group_size, l.axis_len - g * l.group_size);
          const M amax = int4_cpu::finite_absmax(px + k0, n);
          absmax_out[o * l.num_groups + g] = amax;
          nf4_cpu::encode_pack(px + k0, n, k0, M(1) / amax, high_first, packed);
        }
      }
    });
    return;
  }
  parallel_packed_rows(l.outer, l.axis_len * l.inner, packed, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t g = 0; g < l.num_groups; ++g) {
        const int64_t a0 = g * l.group_size;
        const int64_t a1 = std::min(a0 + l.group_size, l.axis_len);
        for (int64_t i = 0; i < l.inner; ++i) {
          // 1. absmax over the group's finite values.
          M amax = M(0);
          for (int64_t a = a0; a < a1; ++a) {
            M v = static_cast<M>(px[(o * l.axis_len + a) * l.inner + i]);
            if (!qmath::is_finite(v)) continue;
            M av = v < M(0) ? -v : v;
            amax = av > amax ? av : amax;
          }
          absmax_out[(o * l.num_groups + g) * l.inner + i] = amax;
          // 2. Codes (1 / 0 = inf for an all-zero group: 0 * inf is NaN -> the 0.0 code).
          const M inv = M(1) / amax;
          for (int64_t a = a0; a < a1; ++a) {
            const int64_t k = (o * l.axis_len + a) * l.inner + i;
            uint8_t c = nf4::encode<M>(static_cast<M>(px[k]), inv);
            packed[k >> 1] |= static_cast<uint8_t>(c << int4::nibble_shift(k, high_first));
          }
        }
      }
    }
  });
}

template <typename S, typename T>
void unpack_dequantize_typed(KernelContext& ctx) {
  const PackedArgs& args = ctx.args<PackedArgs>();
  const ScopeLayout& l = args.layout;
  const bool high_first = args.high_first;
  const uint8_t* packed = ctx.inputs[0].data<uint8_t>();
  const S* absmax = ctx.inputs[1].data<S>();
  for (int64_t q = 0; q < ctx.inputs[1].numel(); ++q) {
    QG_CHECK(qmath::is_finite(absmax[q]) && absmax[q] >= S(0), ctx.op, "absmax[", q,
             "] = ", static_cast<double>(absmax[q]), " must be finite and >= 0");
  }
  T* py = ctx.outputs[0].data<T>();
  parallel_unpack_runs(l, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
    for (int64_t j = 0; j < len; ++j) {
      const int64_t k = k0 + j;
      const S m = absmax[q0 + step * j];
      py[k] = narrow_cast<T>(nf4::decode<S>(int4::get_code(packed, k, high_first), m));
    }
  });
}

template <typename M>
void double_quantize_typed(KernelContext& ctx) {
  const Tensor& absmax = ctx.inputs[0];
  const int64_t n = absmax.numel();
  const int64_t bs = ctx.args<BlockArgs>().block_size;
  const M* pa = absmax.data<M>();
  uint8_t* code = ctx.outputs[0].data<uint8_t>();
  M* scale = ctx.outputs[1].data<M>();
  M* mins = ctx.outputs[2].data<M>();
  for (int64_t b = 0; b * bs < n; ++b) {
    const int64_t e = std::min(n, (b + 1) * bs);
    M mn = pa[b * bs], mx = pa[b * bs];
    for (int64_t j = b * bs; j < e; ++j) {
      QG_CHECK(qmath::is_finite(pa[j]) && pa[j] >= M(0), ctx.op, "absmax[", j,
               "] = ", static_cast<double>(pa[j]), " must be finite and >= 0");
      mn = pa[j] < mn ? pa[j] : mn;
      mx = pa[j] > mx ? pa[j] : mx;
    }
    const auto p = nf4::block_params<M>(mn, mx);
    scale[b] = p.scale;
    mins[b] = p.min;
    for (int64_t j = b * bs; j < e; ++j) code[j] = nf4::block_encode<M>(pa[j], p);
  }
}

template <typename M>
void double_dequantize_typed(KernelContext& ctx) {
  const int64_t n = ctx.inputs[0].numel();
  const int64_t bs = ctx.args<BlockArgs>().block_size;
  const uint8_t* code = ctx.inputs[0].data<uint8_t>();
  const M* scale = ctx.inputs[1].data<M>();
  const M* mins = ctx.inputs[2].data<M>();
  M* out = ctx.outputs[0].data<M>();
  for (int64_t j = 0; j < n; ++j)
    out[j] = nf4::block_decode<M>(code[j], scale[j / bs], mins[j / bs]);
}

}  // namespace

void nf4_quantize_pack_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                 [&](auto tag) { quantize_pack_typed<decltype(tag)>(ctx); });
}

void nf4_unpack_dequantize_cpu(KernelContext& ctx) {
  dispatch_float(ctx.outputs[0].dtype(), ctx.op.c_str(), [&](auto out_tag) {
    using T = decltype(out_tag);
    if (ctx.inputs[1].dtype() == DType::f64) {
      unpack_dequantize_typed<double, T>(ctx);
    } else {
      unpack_dequantize_typed<float, T>(ctx);
    }
  });
}

void nf4_double_quantize_cpu(KernelContext& ctx) {
  if (ctx.inputs[0].dtype() == DType::f64) {
    double_quantize_typed<double>(ctx);
  } else {
    double_quantize_typed<float>(ctx);
  }
}

void nf4_double_dequantize_cpu(KernelContext& ctx) {
  if (ctx.inputs[1].dtype() == DType::f64) {
    double_dequantize_typed<double>(ctx);
  } else {
    double_dequantize_typed<float>(ctx);
  }
}

}  // namespace qg
