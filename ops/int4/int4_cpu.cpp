// CPU kernels for int4_quantize_pack and int4_unpack_dequantize. The per-element math is
// int4_math.h (shared with CUDA); these loops walk the [outer, axis_len, inner] view one
// group at a time: first the group's range, then its codes.
#include <algorithm>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_cpu_runs.h"
#include "ops/int4/int4_math.h"
#include "ops/int4/narrow_cast.h"
#include "ops/int4/packed_args.h"

namespace qg {

Shape check_packed_codes(const InferContext& ctx) {
  const Shape shape = ctx.attrs.get_ints("shape");
  for (int64_t d : shape) {
    QG_CHECK(d >= 0, ctx.op, "attribute 'shape' = ", shape_str(shape), " has a negative size");
  }
  const TensorType& packed = ctx.inputs[0];
  QG_CHECK(packed.dtype == DType::u8 && packed.shape.size() == 1, ctx.op,
           "packed must be a 1-D u8 buffer, got ", packed.str());
  const int64_t want = int4::packed_bytes(shape_numel(shape));
  QG_CHECK(packed.shape[0] == want, ctx.op, "packed buffer has ", packed.shape[0],
           " bytes but shape ", shape_str(shape), " (", shape_numel(shape), " 4-bit codes) needs ",
           want, " bytes");
  return shape;
}

ScopeLayout int4_group_layout(const std::string& op, const Attrs& attrs, const Shape& shape) {
  Attrs group = attrs;
  group.set("scope", "group");
  return scope_layout(op, group, shape);
}

std::shared_ptr<const KernelArgs> parse_packed_args(const ArgsSource& s) {
  auto args = std::make_shared<PackedArgs>();
  if (s.attrs.has("shape")) {
    args->layout = int4_group_layout(s.op, s.attrs, s.attrs.get_ints("shape"));
  } else {
    QG_CHECK(!s.inputs.empty(), s.op, "has no input to lay the groups out over");
    args->layout = int4_group_layout(s.op, s.attrs, s.inputs[0].shape);
  }
  args->symmetric = s.attrs.has("mode") && s.attrs.get_string("mode") == "symmetric";
  args->high_first = s.attrs.get_string("nibble_order") == "high_first";
  return args;
}

std::shared_ptr<const KernelArgs> parse_block_args(const ArgsSource& s) {
  auto args = std::make_shared<BlockArgs>();
  args->block_size = s.attrs.get_int("block_size");
  return args;
}

namespace {

template <typename T>
void quantize_pack_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const Tensor& x = ctx.inputs[0];
  const PackedArgs& args = ctx.args<PackedArgs>();
  const ScopeLayout& l = args.layout;
  const bool symmetric = args.symmetric;
  const bool high_first = args.high_first;
  const T* px = x.data<T>();
  uint8_t* packed = ctx.outputs[0].data<uint8_t>();
  M* scale = ctx.outputs[1].data<M>();
  uint8_t* zp = ctx.outputs[2].data<uint8_t>();
  // Nibbles are OR-ed in, and pad nibbles must read 0: parallel_packed_rows zeroes them.
  // Groups along the last axis are contiguous runs: the range and codes loops of
  // int4_cpu_runs.h, one group at a time while it is in cache.
  if (l.inner == 1) {
    parallel_packed_rows(l.outer, l.axis_len, packed, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        for (int64_t g = 0; g < l.num_groups; ++g) {
          const int64_t k0 = o * l.axis_len + g * l.group_size;
          const int64_t n = std::min(l.group_size, l.axis_len - g * l.group_size);
          int4::GroupParams<M> p;
          if (symmetric) {
            p = int4::symmetric_params<M>(int4_cpu::finite_absmax(px + k0, n));
          } else {
            const int4_cpu::Range<M> r = int4_cpu::finite_range(px + k0, n);
            p = int4::asymmetric_params<M>(r.min, r.max);
          }
          const int64_t qi = o * l.num_groups + g;
          scale[qi] = p.scale;
          zp[qi] = static_cast<uint8_t>(p.zero_point);
          int4_cpu::encode_pack(px + k0, n, k0, p, high_first, packed);
        }
      }
    });
    return;
  }
  const M inf = std::numeric_limits<M>::infinity();
  parallel_packed_rows(l.outer, l.axis_len * l.inner, packed, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t g = 0; g < l.num_groups; ++g) {
        const int64_t a0 = g * l.group_size;
        const int64_t a1 = std::min(a0 + l.group_size, l.axis_len);
        for (int64_t i = 0; i < l.inner; ++i) {
          // 1. The group's range over its finite values.
          M mn = inf, mx = -inf, amax = M(0);
          for (int64_t a = a0; a < a1; ++a) {
            M v = static_cast<M>(px[(o * l.axis_len + a) * l.inner + i]);
            if (!qmath::is_finite(v)) continue;
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
            M av = v < M(0) ? -v : v;
            amax = av > amax ? av : amax;
          }
          const auto p =
              symmetric ? int4::symmetric_params<M>(amax) : int4::asymmetric_params<M>(mn, mx);
          const int64_t qi = (o * l.num_groups + g) * l.inner + i;
          scale[qi] = p.scale;
          zp[qi] = static_cast<uint8_t>(p.zero_point);
          // 2. Its codes, into the flat nibble stream.
          for (int64_t a = a0; a < a1; ++a) {
            const int64_t k = (o * l.axis_len + a) * l.inner + i;
            uint8_t c = int4::encode<M>(static_cast<M>(px[k]), p);
            packed[k >> 1] |= static_cast<uint8_t>(c << int4::nibble_shift(k, high_first));
          }
        }
      }
    }
  });
}

template <typename S, typename T>
void unpack_dequantize_typed(KernelContext& ctx) {
  using M = S;  // the math runs in the scale's type (f32, or f64 for f64 scales)
  const Tensor& zp_t = ctx.inputs[2];
  const PackedArgs& args = ctx.args<PackedArgs>();
  const ScopeLayout& l = args.layout;
  const bool high_first = args.high_first;
  const uint8_t* packed = ctx.inputs[0].data<uint8_t>();
  const S* scale = ctx.inputs[1].data<S>();
  std::vector<M> zp(static_cast<size_t>(zp_t.numel()));
  for (int64_t q = 0; q < zp_t.numel(); ++q) {
    double z = zp_t.at(q);
    QG_CHECK(z >= 0 && z <= 15, ctx.op, "zero_point[", q, "] = ", z, " is outside [0, 15]");
    double s = ctx.inputs[1].at(q);
    QG_CHECK(qmath::is_finite(s) && s > 0, ctx.op, "scale[", q, "] = ", s,
             " must be positive and finite");
    zp[q] = static_cast<M>(z);
  }
  T* py = ctx.outputs[0].data<T>();
  parallel_unpack_runs(l, [&](int64_t k0, int64_t len, int64_t q0, int64_t step) {
    for (int64_t j = 0; j < len; ++j) {
      const int64_t k = k0 + j, qi = q0 + step * j;
      py[k] =
          narrow_cast<T>(int4::decode<M>(int4::get_code(packed, k, high_first), scale[qi], zp[qi]));
    }
  });
}

}  // namespace

void int4_quantize_pack_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                 [&](auto tag) { quantize_pack_typed<decltype(tag)>(ctx); });
}

void int4_unpack_dequantize_cpu(KernelContext& ctx) {
  dispatch_float(ctx.outputs[0].dtype(), ctx.op.c_str(), [&](auto out_tag) {
    using T = decltype(out_tag);
    if (ctx.inputs[1].dtype() == DType::f64) {
      unpack_dequantize_typed<double, T>(ctx);
    } else {
      unpack_dequantize_typed<float, T>(ctx);
    }
  });
}

}  // namespace qg
