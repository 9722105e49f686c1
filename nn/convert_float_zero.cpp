// Integer form of a weight with a float zero point (torchao's int4 weight-only QAT, tinygemm's
// format; ops/dynamic_fake_quantize/dynamic_fake_quantize_math.h gives the math):
//   low = S(zero - S(scale * mid)),  q = clamp(rint((w - low) / scale), 0, 2^b - 1)
//   w'  = T(T((q - mid) * scale) + zero)
// The unsigned codes are stored as packed INT4 nibbles with zero point `mid` (8 for 4 bits),
// so int4_unpack_dequantize gives (q - mid) * scale in f32; the float zero of each group is
// then added by an `add` over a [out, groups, group_size] view. For f32 weights (T = f32, the
// master weights of f32 and bf16-mixed training) both steps are the fake-quant's own f32
// operations, so the converted weight equals the fake-quantized one bit for bit.
#include "nn/convert_float_zero.h"

#include <cmath>

#include "core/error.h"
#include "ops/dynamic_fake_quantize/dynamic_fake_quantize_math.h"

namespace qg::nn {
namespace {

dfq::Rounding rounding_of_name(const std::string& name) {
  if (name == "bf16") return dfq::Rounding::bf16;
  if (name == "f16") return dfq::Rounding::f16;
  return dfq::Rounding::none;  // f32, or "input" on the f32 weights converted here
}

std::vector<float> cpu_floats(const Tensor& t) {
  Tensor c = t.to(Device::cpu());
  QG_CHECK(c.dtype() == DType::f32, "convert", "expected an f32 tensor, got ", c.str());
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

}  // namespace

ValueId float_zero_integer_weight(Graph& g, const WeightQuantizer& w,
                                  const std::vector<Tensor>& fetched) {
  const Shape shape = g.value(w.quantized).type.shape;  // [out, in]
  const DType wdtype = g.value(w.source).type.dtype;
  QG_CHECK(shape.size() == 2, "convert", "layer '", w.layer, "': weight of shape ",
           shape_str(shape), " with a float zero point; only [out, in] matrices convert");
  QG_CHECK(wdtype == DType::f32, "convert", "layer '", w.layer, "': a float zero point on ",
           dtype_name(wdtype),
           " weights has no exact integer form here (the fake-quant rounds each step to that "
           "dtype); f32 master weights (f32 or bf16-mixed training) convert");
  const Attrs& a = g.node(w.observer).attrs;
  const int64_t out = shape[0], in = shape[1];
  const int64_t qmin = a.get_int("quant_min"), qmax = a.get_int("quant_max");
  QG_CHECK(qmin == 0 && qmax <= 15, "convert", "layer '", w.layer, "': codes [", qmin, ", ", qmax,
           "] with a float zero point do not fit a 4-bit nibble");
  const int64_t gs = a.get_int("group_size") == 0 ? in : a.get_int("group_size");
  const int64_t groups = in / gs;
  dfq::Config c;
  c.qmin = static_cast<int32_t>(qmin);
  c.qmax = static_cast<int32_t>(qmax);
  c.mode = dfq::Mode::float_zero;
  c.qparam_rounding = rounding_of_name(a.get_string("qparam_dtype"));
  c.promoted_rounding = dfq::Rounding::none;  // f32 with bf16/f16/f32 qparams promotes to f32
  c.mid = static_cast<double>(qmax + qmin + 1) / 2.0;
  const std::string name = w.layer + ".weight.int";

  const std::vector<float> src = cpu_floats(fetched[0]);
  const std::vector<float> scale = cpu_floats(fetched[1]), zero = cpu_floats(fetched[2]);
  QG_CHECK(static_cast<int64_t>(scale.size()) == out * groups && zero.size() == scale.size(),
           "convert", "layer '", w.layer, "': ", scale.size(), " scales and ", zero.size(),
           " zeros for ", out, " rows of ", groups, " groups");
  std::vector<uint8_t> packed(static_cast<size_t>((out * in + 1) / 2), 0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k) {
      const int64_t q = o * groups + k / gs, e = o * in + k;
      dfq::QParams<float> p{scale[q], zero[q], true};
      QG_CHECK(std::isfinite(src[e]) && std::isfinite(p.scale) && p.scale > 0 &&
                   std::isfinite(p.zero_point),
               "convert", "layer '", w.layer, "': weight ", src[e], " at [", o, ", ", k,
               "] with scale ", p.scale, " and zero ", p.zero_point, " has no integer code");
      p.low = dfq::float_zero_low(p.scale, p.zero_point, c);
      // The fake-quant's code, the same f32 operations as dfq::fake_quant_float_zero.
      const float u = (src[e] - p.low) / p.scale;
      const float r =
          std::min(std::max(std::nearbyint(u), static_cast<float>(qmin)), static_cast<float>(qmax));
      const uint8_t v = static_cast<uint8_t>(r);
      packed[e / 2] |= (e % 2 == 0) ? v : static_cast<uint8_t>(v << 4);
    }
  const Shape qshape{out, groups};
  ValueId p = g.constant(
      Tensor::from_vector<uint8_t>({static_cast<int64_t>(packed.size())}, packed), name + ".codes");
  ValueId s = g.constant(Tensor::from_vector<float>(qshape, scale), name + ".scale");
  ValueId mid =
      g.constant(Tensor::from_vector<uint8_t>(
                     qshape, std::vector<uint8_t>(scale.size(), static_cast<uint8_t>(c.mid))),
                 name + ".zero_point");
  ValueId centred =
      g.apply1("int4_unpack_dequantize", {p, s, mid},
               {{"group_size", gs}, {"axis", -1}, {"shape", shape}}, name + ".dequantize");
  ValueId z = g.constant(Tensor::from_vector<float>({out, groups, 1}, zero), name + ".zero");
  ValueId view =
      g.apply1("reshape", {centred}, {{"shape", Shape{out, groups, gs}}}, name + ".groups");
  ValueId shifted = g.apply1("add", {view, z}, {}, name + ".add_zero");
  return g.apply1("reshape", {shifted}, {{"shape", shape}}, name + ".rows");
}

}  // namespace qg::nn
