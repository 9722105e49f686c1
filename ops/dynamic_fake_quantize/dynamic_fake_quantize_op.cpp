// dynamic_fake_quantize(x) -> (y, mask, scale, zero_point): fake quantization whose qparams
// come from x itself on every call, one (scale, zero point) per group of `group_size`
// consecutive elements of the last axis (the whole last axis when group_size is 0: per
// token for activations, per output channel for a [out, in] weight), with torchao's QAT
// arithmetic (dynamic_fake_quantize_math.h): its 8da4w recipe's per-token asymmetric int8
// activations and per-group symmetric int4 weights, in the input's dtype, and its int4
// weight-only recipe's float zero point (mode float_zero, qparams stored in `qparam_dtype`).
// The integer modes' element math is fake_quantize's (qmath::fake_quant in the math type, y
// rounded to x's dtype once); float_zero's is torchao's tinygemm quantize + dequantize. The
// mask is the bit-packed in-range mask, so the STE backward is ste_backward's.
// One kernel reads x once: the qparams never round-trip through memory before use.
#include <cmath>

#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/cast/cast_element.h"
#include "ops/common/bitmask.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/schema_helpers.h"
#include "ops/dynamic_fake_quantize/dfq_cast_fusion.h"
#include "ops/dynamic_fake_quantize/dynamic_fake_quantize_args.h"

namespace qg {
namespace {

dfq::Rounding rounding_of(DType t) {
  if (t == DType::bf16) return dfq::Rounding::bf16;
  if (t == DType::f16) return dfq::Rounding::f16;
  return dfq::Rounding::none;
}

// The dtype torch computes a binary op of a T tensor and an S tensor in (float dtypes).
DType promoted(DType t, DType s) {
  if (t == s) return t;
  if (t == DType::f64 || s == DType::f64) return DType::f64;
  return DType::f32;  // f32 with anything narrower, and f16 with bf16
}

// The range, mode and eps, checked when the node is built and again when it is prepared.
void check_attrs(const std::string& op, const Attrs& attrs) {
  const int64_t qmin = attrs.get_int("quant_min"), qmax = attrs.get_int("quant_max");
  QG_CHECK(qmin < qmax, op, "quant_min = ", qmin, " must be below quant_max = ", qmax);
  QG_CHECK(qmin >= -(int64_t{1} << 16) && qmax <= (int64_t{1} << 16), op,
           "[quant_min, quant_max] = [", qmin, ", ", qmax, "] is wider than 17 bits");
  const std::string& mode = attrs.get_string("mode");
  QG_CHECK(mode != "symmetric" || (qmin < 0 && qmax > 0), op,
           "attribute 'mode' = symmetric needs a signed range around 0, got [", qmin, ", ", qmax,
           "]");
  QG_CHECK(mode != "float_zero" || qmin == 0, op,
           "attribute 'mode' = float_zero takes unsigned codes from 0 (torchao's uint range), "
           "got [",
           qmin, ", ", qmax, "]");
  QG_CHECK(mode == "float_zero" || attrs.get_string("qparam_dtype") == "input", op,
           "attribute 'qparam_dtype' = ", attrs.get_string("qparam_dtype"),
           " applies to mode float_zero only (mode is ", mode, ")");
  const double eps = attrs.get_real("eps");
  QG_CHECK(std::isfinite(eps) && eps >= 0, op, "attribute 'eps' = ", eps,
           " must be finite and >= 0");
}

// y's dtype. A narrower out_dtype is the f32 -> bf16/f16 cast of a weight for a mixed-precision
// GEMM, fused in (fuse_dfq_cast): y = narrow(fake_quant(x)) is then exactly the cast of the
// f32 result. Other inputs would round twice in the composition, so they are refused.
DType out_dtype_of(const std::string& op, const Attrs& attrs, DType x) {
  const std::string& name = attrs.get_string("out_dtype");
  if (name == "input") return x;
  const DType out = dtype_from_name(name);
  QG_CHECK(out == x || x == DType::f32, op, "attribute 'out_dtype' = '", name,
           "' narrows an f32 x only (y is the cast of the f32 fake-quant), got x of dtype ",
           dtype_name(x));
  return out;
}

std::shared_ptr<const KernelArgs> parse_args(const ArgsSource& s) {
  auto a = std::make_shared<DynamicFakeQuantizeArgs>();
  const TensorType& x = s.inputs.at(0);
  QG_CHECK(!x.shape.empty(), s.op,
           "x must have at least one axis (groups run along the last), got ", x.str());
  const int64_t last = x.shape.back();
  QG_CHECK(last > 0, s.op, "the last axis of x is empty: ", x.str());
  const int64_t g = s.attrs.get_int("group_size");
  QG_CHECK(g == 0 || (last > 0 && last % g == 0), s.op, "attribute 'group_size' = ", g,
           " does not divide the last axis of ", x.str());
  check_attrs(s.op, s.attrs);
  const int64_t qmin = s.attrs.get_int("quant_min"), qmax = s.attrs.get_int("quant_max");
  const std::string& mode = s.attrs.get_string("mode");
  const bool symmetric = mode == "symmetric";
  const double eps = s.attrs.get_real("eps");
  a->group_len = g == 0 ? last : g;
  a->groups = x.numel() / a->group_len;
  a->config.qmin = static_cast<int32_t>(qmin);
  a->config.qmax = static_cast<int32_t>(qmax);
  a->config.mode = symmetric              ? dfq::Mode::symmetric
                   : mode == "float_zero" ? dfq::Mode::float_zero
                                          : dfq::Mode::asymmetric;
  a->config.eps = eps;
  a->config.rounding = rounding_of(x.dtype);
  a->out = out_dtype_of(s.op, s.attrs, x.dtype);
  const std::string& qdt = s.attrs.get_string("qparam_dtype");
  const DType qparam = qdt == "input" ? x.dtype : dtype_from_name(qdt);
  a->config.qparam_rounding = rounding_of(qparam);
  a->config.promoted_rounding = rounding_of(promoted(x.dtype, qparam));
  a->config.mid = static_cast<double>(qmax + qmin + 1) / 2.0;
  // The divisor as torch holds a Python float (f64), converted to the math type; its
  // reciprocal is taken in the math type (PyTorch's CUDA division by a CPU scalar).
  const double range = static_cast<double>(qmax - qmin) / (symmetric ? 2.0 : 1.0);
  if (x.dtype == DType::f64)
    a->config.inv_range = 1.0 / range;
  else
    a->config.inv_range = static_cast<double>(1.0f / static_cast<float>(range));
  return a;
}

std::vector<TensorType> infer(const InferContext& ctx) {
  expect_float(ctx, 0);
  check_attrs(ctx.op, ctx.attrs);
  const TensorType& x = ctx.inputs[0];
  QG_CHECK(!x.shape.empty(), ctx.op, "x must have at least one axis, got ", x.str());
  const int64_t g = ctx.attrs.get_int("group_size");
  const int64_t last = x.shape.back();
  QG_CHECK(last > 0, ctx.op, "the last axis of x is empty: ", x.str());
  QG_CHECK(g == 0 || (last > 0 && last % g == 0), ctx.op, "attribute 'group_size' = ", g,
           " does not divide the last axis of ", x.str());
  Shape qshape(x.shape.begin(), x.shape.end() - 1);
  if (g != 0) qshape.push_back(last / g);
  const DType zp = ctx.attrs.get_string("mode") == "float_zero" ? DType::f32 : DType::i32;
  return {TensorType{out_dtype_of(ctx.op, ctx.attrs, x.dtype), x.shape},
          TensorType{DType::u8, {bitmask_bytes(x.numel())}}, TensorType{DType::f32, qshape},
          TensorType{zp, qshape}};
}

// O: y's element type, T's or (out_dtype) a narrower one for an f32 T.
template <typename T, typename O>
void cpu_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const DynamicFakeQuantizeArgs& a = ctx.args<DynamicFakeQuantizeArgs>();
  const T* x = ctx.inputs[0].data<T>();
  O* y = ctx.outputs[0].data<O>();
  uint8_t* mask = ctx.outputs[1].data<uint8_t>();
  float* scale = ctx.outputs[2].data<float>();
  const bool float_zero = a.config.mode == dfq::Mode::float_zero;
  const int64_t len = a.group_len, n = ctx.inputs[0].numel();
  std::fill(mask, mask + bitmask_bytes(n), uint8_t{0});
  // Groups are checked first, in order, so the error names the first bad one.
  std::vector<dfq::QParams<M>> qp(static_cast<size_t>(a.groups));
  parallel_for(a.groups, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(len, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t q = b; q < e; ++q) {
                   const T* g = x + q * len;
                   M mn = static_cast<M>(g[0]), mx = mn;
                   // torch.amin / amax: a NaN anywhere is the result.
                   for (int64_t i = 1; i < len && !qmath::is_nan(mn); ++i) {
                     const M v = static_cast<M>(g[i]);
                     if (qmath::is_nan(v)) {
                       mn = mx = v;
                     } else {
                       mn = v < mn ? v : mn;
                       mx = v > mx ? v : mx;
                     }
                   }
                   qp[q] = dfq::qparams(mn, mx, a.config);
                 }
               });
  for (int64_t q = 0; q < a.groups; ++q)
    if (!qp[q].valid) check_scale_value(ctx.op, static_cast<double>(qp[q].scale), q);
  const M qmin = static_cast<M>(a.config.qmin), qmax = static_cast<M>(a.config.qmax);
  for (int64_t q = 0; q < a.groups; ++q) {
    scale[q] = static_cast<float>(qp[q].scale);
    if (float_zero)
      ctx.outputs[3].data<float>()[q] = static_cast<float>(qp[q].zero_point);
    else
      ctx.outputs[3].data<int32_t>()[q] = static_cast<int32_t>(qp[q].zero_point);
  }
  // Elements in runs of whole mask bytes, so no two threads write one byte.
  parallel_for(
      bitmask_bytes(n), std::max<int64_t>(1, kElementGrain / 8), [&](int64_t b, int64_t e) {
        for (int64_t i = b * 8; i < std::min(n, e * 8); ++i) {
          const dfq::QParams<M>& p = qp[i / len];
          const M s = p.scale, inv = M(1) / s;
          qmath::FakeQuantResult<M> r =
              float_zero
                  ? dfq::fake_quant_float_zero(static_cast<M>(x[i]), p, qmin, qmax, a.config)
                  : qmath::fake_quant(static_cast<M>(x[i]), inv, s, p.zero_point, qmin, qmax);
          // Narrowed to T, then (out_dtype) cast as the cast op does: one rounding from f32.
          y[i] = cast_element<O>(static_cast<T>(r.y));
          if (r.in_range) mask[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
        }
      });
}

void dynamic_fake_quantize_cpu(KernelContext& ctx) {
  if (ctx.inputs[0].numel() == 0) return;
  const DType out = ctx.args<DynamicFakeQuantizeArgs>().out;
  if (out == DType::bf16 && ctx.inputs[0].dtype() == DType::f32) return cpu_typed<float, bf16>(ctx);
  if (out == DType::f16 && ctx.inputs[0].dtype() == DType::f32) return cpu_typed<float, f16>(ctx);
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    cpu_typed<T, T>(ctx);
  });
}

// The gradient check's reference: dx = dy where x's code lies in [qmin, qmax] under the
// qparams the op computes (the STE), recomputed here from the same qparam math.
std::vector<Tensor> ste_reference(const std::vector<Tensor>& in, const Tensor& dy,
                                  const Attrs& attrs) {
  const std::vector<TensorType> types = {{in[0].dtype(), in[0].shape()}};
  const std::string op = "dynamic_fake_quantize";
  auto parsed = parse_args(ArgsSource{op, attrs, types, {}});
  const auto& a = static_cast<const DynamicFakeQuantizeArgs&>(*parsed);
  Tensor dx = Tensor::zeros(in[0].shape(), DType::f64);
  for (int64_t q = 0; q < a.groups; ++q) {
    double mn = in[0].at(q * a.group_len), mx = mn;
    for (int64_t i = 0; i < a.group_len; ++i) {
      mn = std::min(mn, in[0].at(q * a.group_len + i));
      mx = std::max(mx, in[0].at(q * a.group_len + i));
    }
    dfq::QParams<double> p = dfq::qparams(mn, mx, a.config);
    const double qmin = a.config.qmin, qmax = a.config.qmax;
    for (int64_t i = 0; i < a.group_len; ++i) {
      const int64_t k = q * a.group_len + i;
      bool in_range;
      if (a.config.mode == dfq::Mode::float_zero) {
        in_range = dfq::fake_quant_float_zero(in[0].at(k), p, qmin, qmax, a.config).in_range;
      } else {
        const double code = std::nearbyint(in[0].at(k) * (1.0 / p.scale)) + p.zero_point;
        in_range = code >= qmin && code <= qmax;
      }
      dx.data<double>()[k] = in_range ? dy.at(k) : 0.0;
    }
  }
  return {dx};
}

GradcheckSample sample(const std::string& label, Shape x, Attrs attrs) {
  GradcheckSample s(label, {GradcheckInput{x, DType::f64, -3.0, 3.0, {}}}, std::move(attrs));
  s.reference = ste_reference;
  return s;
}

}  // namespace

void add_dynamic_fake_quantize_cuda_kernels(OpRegistry& r);  // dynamic_fake_quantize_cuda.cu
void add_dynamic_fake_quantize_crosscheck(OpRegistry& r);    // dynamic_fake_quantize_crosscheck.cpp

void define_dynamic_fake_quantize_ops(OpRegistry& r) {
  OpDef& op = r.define("dynamic_fake_quantize");
  op.doc =
      "Fake quantization with qparams from x itself per group of the last axis, torchao's QAT "
      "arithmetic in x's dtype; outputs y, the bit-packed in-range mask, scale and zero_point "
      "(i32; f32 for mode float_zero).";
  op.inputs = {"x"};
  op.outputs = {"y", "mask", "scale", "zero_point"};
  op.attrs = {
      int_attr("group_size", 0, "elements per group along the last axis; 0: the whole axis", 0),
      string_attr("mode", std::string("asymmetric"), {"asymmetric", "symmetric", "float_zero"},
                  "asymmetric: range [min(x, 0), max(x, 0)]; symmetric: max |x|, zero point 0; "
                  "float_zero: range [min(x), max(x)], a float zero point (torchao's int4 "
                  "weight-only QAT, tinygemm's format)"),
      string_attr("qparam_dtype", std::string("input"), {"input", "f32", "bf16", "f16"},
                  "float_zero: the dtype scale and zero are rounded to (torchao's "
                  "scale_precision; bf16 for its int4 weight-only QAT); input: x's dtype"),
      int_attr("quant_min", std::nullopt, "smallest code"),
      int_attr("quant_max", std::nullopt, "largest code"),
      string_attr("out_dtype", std::string("input"), {"input", "bf16", "f16"},
                  "y's dtype: x's (input), or bf16/f16 from an f32 x: exactly the fake-quant "
                  "cast to it (the fusion of a weight's cast to a mixed-precision GEMM)"),
      real_attr("eps", 1.1920928955078125e-07,
                "the scale's floor (torchao: f32's epsilon for activations, the dtype's smallest "
                "normal for weights)")};
  op.parse_args = parse_args;
  op.fusion_rules = {dfq_cast_fusion_rule()};
  op.differentiable_inputs = {true};
  op.infer = infer;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, dynamic_fake_quantize_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    ValueId dy = c.grad_or_zeros(0);
    // A narrowed y: its gradient comes back to x's dtype, as a separate cast's backward would.
    const DType x = c.graph.value(c.node.inputs[0]).type.dtype;
    if (c.graph.value(dy).type.dtype != x)
      dy = c.graph.apply1("cast", {dy}, {{"dtype", std::string(dtype_name(x))}});
    return {c.graph.apply1("ste_backward", {dy, c.node.outputs[1]})};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        sample("per token s8 [3,8]", {3, 8}, {{"quant_min", -128}, {"quant_max", 127}}),
        sample("group 4 symmetric s4 [2,8]", {2, 8},
               {{"group_size", 4},
                {"mode", std::string("symmetric")},
                {"quant_min", -8},
                {"quant_max", 7}}),
        sample("group 4 float_zero u4 [2,8]", {2, 8},
               {{"group_size", 4},
                {"mode", std::string("float_zero")},
                {"quant_min", 0},
                {"quant_max", 15},
                {"eps", 1e-6}}),
        sample("group 8 float_zero u4, bf16 qparams [3,16]", {3, 16},
               {{"group_size", 8},
                {"mode", std::string("float_zero")},
                {"qparam_dtype", std::string("bf16")},
                {"quant_min", 0},
                {"quant_max", 15},
                {"eps", 1e-6}}),
    };
  };
#ifdef QG_WITH_CUDA
  add_dynamic_fake_quantize_cuda_kernels(r);
#endif
  add_dynamic_fake_quantize_crosscheck(r);
}

}  // namespace qg
