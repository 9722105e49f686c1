// NF4 (NormalFloat-4) group quantization, SEMANTICS.md "NF4":
//   nf4_quantize_pack(x) -> (packed, absmax)
//   nf4_unpack_dequantize(packed, absmax) -> x'
// and the optional double quantization of the absmax values (8-bit blockwise):
//   nf4_double_quantize(absmax) -> (code, block_scale, block_min)
//   nf4_double_dequantize(code, block_scale, block_min) -> absmax'
// Double quantization is a pair of separate ops so a graph opts in by chaining them
// (quantize_pack -> double_quantize; double_dequantize -> unpack_dequantize) and every op
// keeps a fixed set of outputs. Group layout and packing are INT4's (ops/int4). None of
// these ops is differentiable.
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_math.h"
#include "ops/int4/packed_args.h"
#include "ops/nf4/nf4_cpu.h"

namespace qg {
namespace {

AttrSpec positive_int_attr(const std::string& name, int64_t def, const std::string& doc) {
  AttrSpec s = int_attr(name, def, doc);
  s.validate = [name](const std::string& op, const Attr& v) {
    QG_CHECK(v.as_int() > 0, op, "attribute '", name, "' = ", v.as_int(), " must be positive");
  };
  return s;
}

std::vector<AttrSpec> layout_attrs() {
  return {
      positive_int_attr("group_size", 64, "elements per absmax group (the last may be shorter)"),
      int_attr("axis", -1, "the axis groups run along; negative counts from the end"),
      string_attr("nibble_order", "low_first", {"low_first", "high_first"},
                  "low_first: even element in the low nibble; high_first: bitsandbytes layout"),
  };
}

DType math_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

std::vector<TensorType> infer_quantize_pack(const InferContext& ctx) {
  expect_float(ctx, 0);
  const Shape& shape = ctx.inputs[0].shape;
  ScopeLayout l = int4_group_layout(ctx.op, ctx.attrs, shape);
  return {TensorType{DType::u8, {int4::packed_bytes(shape_numel(shape))}},
          TensorType{math_dtype(ctx.inputs[0].dtype), l.qparam_shape}};
}

std::vector<TensorType> infer_unpack_dequantize(const InferContext& ctx) {
  const Shape shape = check_packed_codes(ctx);
  ScopeLayout l = int4_group_layout(ctx.op, ctx.attrs, shape);
  const TensorType& absmax = ctx.inputs[1];
  QG_CHECK(absmax.dtype == DType::f32 || absmax.dtype == DType::f64, ctx.op,
           "absmax must be f32 or f64, got ", absmax.str());
  QG_CHECK(absmax.shape == l.qparam_shape, ctx.op, "absmax has shape ", shape_str(absmax.shape),
           " but shape ", shape_str(shape), " with group_size ", l.group_size, " needs ",
           shape_str(l.qparam_shape));
  const std::string& out = ctx.attrs.get_string("dtype");
  return {TensorType{out == "auto" ? absmax.dtype : dtype_from_name(out), shape}};
}

int64_t num_blocks(int64_t n, int64_t block_size) {
  return (n + block_size - 1) / block_size;
}

std::vector<TensorType> infer_double_quantize(const InferContext& ctx) {
  const TensorType& a = ctx.inputs[0];
  QG_CHECK(a.dtype == DType::f32 || a.dtype == DType::f64, ctx.op,
           "absmax must be f32 or f64, got ", a.str());
  const int64_t nb = num_blocks(a.numel(), ctx.attrs.get_int("block_size"));
  return {TensorType{DType::u8, a.shape}, TensorType{a.dtype, {nb}}, TensorType{a.dtype, {nb}}};
}

std::vector<TensorType> infer_double_dequantize(const InferContext& ctx) {
  const TensorType& code = ctx.inputs[0];
  const TensorType& scale = ctx.inputs[1];
  const TensorType& mins = ctx.inputs[2];
  QG_CHECK(code.dtype == DType::u8, ctx.op, "code must be u8, got ", code.str());
  QG_CHECK(scale.dtype == DType::f32 || scale.dtype == DType::f64, ctx.op,
           "block_scale must be f32 or f64, got ", scale.str());
  QG_CHECK(mins.dtype == scale.dtype, ctx.op, "block_min ", mins.str(),
           " must have block_scale's dtype ", dtype_name(scale.dtype));
  const int64_t bs = ctx.attrs.get_int("block_size");
  const Shape want = {num_blocks(code.numel(), bs)};
  QG_CHECK(scale.shape == want && mins.shape == want, ctx.op, "block_scale ",
           shape_str(scale.shape), " and block_min ", shape_str(mins.shape), " must be ",
           shape_str(want), " for ", code.numel(), " codes in blocks of ", bs);
  return {TensorType{scale.dtype, code.shape}};
}

}  // namespace

void add_nf4_cuda_kernels(OpRegistry& r);  // nf4_cuda.cu
void add_nf4_crosscheck(OpRegistry& r);    // nf4_crosscheck.cpp

void define_nf4_ops(OpRegistry& r) {
  OpDef& q = r.define("nf4_quantize_pack");
  q.doc =
      "NF4 group quantization: absmax over each group's finite values (f32; f64 for f64 x), "
      "v = x * (1 / absmax), code = number of NF4 midpoints ((t[i] + t[i+1]) * 0.5 in the "
      "math type) strictly below v, so ties take the lower code; NaN -> code 7 (0.0), "
      "+/-Inf -> 15 / 0. A group with no nonzero finite value stores absmax 0 and every "
      "finite value gets code 7 (1 / 0 = inf, 0 * inf = NaN -> 0.0), so it dequantizes to "
      "exact zeros. Packing as int4_quantize_pack: flat C order, element k in byte k / 2, "
      "low nibble first unless nibble_order = high_first, odd counts pad with a 0 nibble.";
  q.inputs = {"x"};
  q.outputs = {"packed", "absmax"};
  q.attrs = layout_attrs();
  q.infer = infer_quantize_pack;
  q.parse_args = parse_packed_args;
  q.kernels.push_back({DeviceType::cpu, kFloatDTypes, nf4_quantize_pack_cpu});

  OpDef& d = r.define("nf4_unpack_dequantize");
  d.doc =
      "Inverse of nf4_quantize_pack: x' = table[code] * absmax in absmax's type, with "
      "`shape` the logical shape and the same group_size, axis and nibble_order. The packed "
      "buffer must hold exactly ceil(numel / 2) bytes; absmax must be finite and >= 0.";
  d.inputs = {"packed", "absmax"};
  d.outputs = {"x"};
  d.attrs = layout_attrs();
  d.attrs.push_back(ints_attr("shape", std::nullopt, "logical shape of the unpacked tensor"));
  d.attrs.push_back(string_attr("dtype", "auto", {"auto", "f32", "f64", "f16", "bf16"},
                                "output dtype (auto: absmax's dtype)"));
  d.infer = infer_unpack_dequantize;
  d.parse_args = parse_packed_args;
  d.kernels.push_back({DeviceType::cpu, {DType::u8}, nf4_unpack_dequantize_cpu});

  OpDef& dq = r.define("nf4_double_quantize");
  dq.doc =
      "Double quantization of NF4 absmax values, 8-bit blockwise over the flat absmax tensor: "
      "each block of block_size values gets min and scale = (max - min) / 255 (1 when that "
      "is 0 or has no finite reciprocal), code = clamp(rint((a - min) * (1 / scale)), 0, 255). "
      "Outputs code (u8, absmax's shape), block_scale and block_min ([ceil(n / block_size)], "
      "absmax's dtype). absmax values must be finite and >= 0.";
  dq.inputs = {"absmax"};
  dq.outputs = {"code", "block_scale", "block_min"};
  dq.attrs = {positive_int_attr("block_size", 256, "absmax values per 8-bit block")};
  dq.infer = infer_double_quantize;
  dq.parse_args = parse_block_args;
  dq.kernels.push_back({DeviceType::cpu, kF32F64DTypes, nf4_double_quantize_cpu});

  OpDef& dd = r.define("nf4_double_dequantize");
  dd.doc = "Inverse of nf4_double_quantize: absmax' = code * block_scale + block_min.";
  dd.inputs = {"code", "block_scale", "block_min"};
  dd.outputs = {"absmax"};
  dd.attrs = {positive_int_attr("block_size", 256, "absmax values per 8-bit block")};
  dd.infer = infer_double_dequantize;
  dd.parse_args = parse_block_args;
  dd.kernels.push_back({DeviceType::cpu, {DType::u8}, nf4_double_dequantize_cpu});
#ifdef QG_WITH_CUDA
  add_nf4_cuda_kernels(r);
#endif
  add_nf4_crosscheck(r);
}

}  // namespace qg
