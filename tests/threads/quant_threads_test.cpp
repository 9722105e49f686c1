// The parallel CPU quantization kernels give the same bytes with 1, 2, 3 and 8 threads:
// fake_quantize + ste_backward, the observers, the fused observer + quantizer (every
// schedule), quantize / dequantize and their backward ops, LSQ, dynamic quantization and
// INT4 / NF4 packing. Shapes span many 16 Ki-element chunks and are not multiples of the
// chunk, of 8 (mask bytes) or of 2 (packed nibbles); the data carries NaN, Inf and signed
// zeros.
#include "ops/common/quant_scope.h"
#include "tests/threads/thread_test_util.h"

namespace qg {
namespace {

using threads_test::Case;
using threads_test::data;
using threads_test::expect_same_for_every_thread_count;

struct Scope {
  std::string label;
  Shape shape;
  Attrs attrs;
};

std::vector<Scope> scopes() {
  return {
      {"tensor", {37, 4099}, {}},
      {"channel_first", {65, 1031}, {{"scope", "channel"}, {"axis", 0}}},
      {"channel_middle", {7, 33, 301}, {{"scope", "channel"}, {"axis", 1}}},
      {"channel_last", {1031, 67}, {{"scope", "channel"}, {"axis", -1}}},
      {"token", {513, 257}, {{"scope", "token"}}},
      {"group_last", {129, 1000}, {{"scope", "group"}, {"axis", -1}, {"group_size", 96}}},
      {"group_first", {130, 517}, {{"scope", "group"}, {"axis", 0}, {"group_size", 32}}},
  };
}

// observer -> fake_quantize -> ste_backward, unfused and fused, for several observers.
TEST(QuantThreads, ObserverFakeQuantizeSte) {
  for (const Scope& s : scopes())
    for (const char* observer : {"minmax_observer", "moving_average_observer"})
      for (bool delayed : {false, true})
        for (bool fuse : {false, true}) {
          if (delayed && std::string(observer) != "minmax_observer") continue;
          const DType dt = s.label == "tensor" || s.label == "channel_last" ? DType::bf16
                           : s.label == "token"                             ? DType::f16
                                                                            : DType::f32;
          for (DType dtype : {DType::f32, dt}) {
            if (dtype != DType::f32 && (delayed || !fuse)) continue;
            Case c;
            c.label = s.label + " " + observer + (delayed ? " delayed" : "") +
                      (fuse ? " fused " : " ") + dtype_name(dtype);
            c.fuse = fuse;
            c.feeds = {{"x", data(s.shape, dtype, 1, 3.0)}, {"dy", data(s.shape, dtype, 2)}};
            c.build = [s, observer, delayed, dtype](Graph& g) {
              ValueId x = g.input("x", {dtype, s.shape});
              ValueId dy = g.input("dy", {dtype, s.shape});
              Attrs oa = s.attrs;
              if (delayed) oa.set("delayed", true);
              auto qp = g.apply(observer, {x}, oa);
              auto fq = g.apply("fake_quantize", {x, qp[0], qp[1]}, s.attrs);
              g.apply("ste_backward", {dy, fq[1]});
            };
            c.steps = 3;
            expect_same_for_every_thread_count(c);
          }
        }
}

TEST(QuantThreads, F64FakeQuantizeAndObserver) {
  for (const Scope& s : scopes()) {
    Case c;
    c.label = s.label + " f64";
    c.feeds = {{"x", data(s.shape, DType::f64, 3, 2.0)}};
    c.build = [s](Graph& g) {
      ValueId x = g.input("x", {DType::f64, s.shape});
      auto qp = g.apply("minmax_observer", {x}, s.attrs);
      g.apply("fake_quantize", {x, qp[0], qp[1]}, s.attrs);
    };
    expect_same_for_every_thread_count(c);
  }
}

// observer -> quantize (u8 and s8 codes) -> dequantize, and both backward ops; fused too.
TEST(QuantThreads, QuantizeDequantizeAndBackward) {
  for (const Scope& s : scopes())
    for (bool fuse : {false, true})
      for (const char* out : {"u8", "i8"}) {
        Case c;
        c.label = s.label + " quantize " + out + (fuse ? " fused" : "");
        c.fuse = fuse;
        c.feeds = {{"x", data(s.shape, DType::f32, 4, 2.0)}, {"dy", data(s.shape, DType::f32, 5)}};
        c.build = [s, out](Graph& g) {
          ValueId x = g.input("x", {DType::f32, s.shape});
          ValueId dy = g.input("dy", {DType::f32, s.shape});
          Attrs qa = s.attrs;
          qa.set("out_dtype", out);
          if (std::string(out) == "i8") qa.set("signed", true);
          Attrs oa = s.attrs;
          if (std::string(out) == "i8") oa.set("signed", true);
          auto qp = g.apply("minmax_observer", {x}, oa);
          auto q = g.apply("quantize", {x, qp[0], qp[1]}, qa);
          g.apply("dequantize", {q[0], qp[0], qp[1]}, s.attrs);
          g.apply("quantize_backward", {dy, q[1], qp[0]}, s.attrs);
          g.apply("dequantize_backward", {dy, q[0], qp[0], qp[1]}, s.attrs);
        };
        expect_same_for_every_thread_count(c);
      }
}

TEST(QuantThreads, LsqForwardAndBackward) {
  for (const Scope& s : scopes()) {
    if (s.attrs.has("scope") && s.attrs.get_string("scope") != "channel") continue;
    Attrs full = s.attrs;
    if (!full.has("scope")) full.set("scope", "tensor").set("axis", 0);
    const ScopeLayout l = scope_layout("lsq_fake_quantize", full, s.shape);
    for (DType dtype : {DType::f32, DType::f64}) {
      Case c;
      c.label = s.label + " lsq " + dtype_name(dtype);
      std::vector<double> scale(l.num_qparams), zp(l.num_qparams);
      for (int64_t q = 0; q < l.num_qparams; ++q) {
        scale[q] = 0.01 + 0.001 * static_cast<double>(q % 13);
        zp[q] = static_cast<double>(q % 7) * 3.4;
      }
      // No NaN or Inf: they would make the scale and zero-point sums NaN.
      c.feeds = {{"x", data(s.shape, dtype, 6, 1.0, false)},
                 {"dy", data(s.shape, dtype, 7, 1.0, false)},
                 {"scale", Tensor::from_doubles(l.qparam_shape, scale, dtype)},
                 {"zp", Tensor::from_doubles(l.qparam_shape, zp, dtype)}};
      c.build = [s, l, dtype](Graph& g) {
        ValueId x = g.input("x", {dtype, s.shape});
        ValueId dy = g.input("dy", {dtype, s.shape});
        // f64 qparams for f64 x: the sums reach dscale unrounded.
        ValueId sc = g.input("scale", {dtype, l.qparam_shape});
        ValueId z = g.input("zp", {dtype, l.qparam_shape});
        g.apply("lsq_fake_quantize", {x, sc, z}, s.attrs);
        g.apply("lsq_backward", {dy, x, sc, z}, s.attrs);
      };
      expect_same_for_every_thread_count(c);
    }
  }
}

TEST(QuantThreads, DynamicRangeQuantize) {
  for (const Scope& s : scopes())
    for (const char* mode : {"symmetric", "affine"})
      for (DType dtype : {DType::f32, DType::bf16}) {
        Case c;
        c.label = s.label + " dynamic " + mode + " " + dtype_name(dtype);
        // No Inf: an infinite range is an error of the op.
        c.feeds = {{"x", data(s.shape, dtype, 8, 4.0, false)}};
        c.build = [s, mode, dtype](Graph& g) {
          ValueId x = g.input("x", {dtype, s.shape});
          Attrs a = s.attrs;
          a.set("mode", mode);
          if (std::string(mode) == "symmetric") a.set("signed", true);
          g.apply("dynamic_range_quantize", {x}, a);
        };
        expect_same_for_every_thread_count(c);
      }
}

TEST(QuantThreads, Int4AndNf4PackUnpack) {
  struct Pack {
    Shape shape;
    int axis, group;
  };
  for (const Pack& p : {Pack{{257, 1000}, -1, 128}, Pack{{129, 999}, -1, 64},
                        Pack{{301, 77}, 0, 32}, Pack{{5, 301, 33}, 1, 16}})
    for (const char* family : {"int4", "nf4"}) {
      Case c;
      c.label = std::string(family) + " " + shape_str(p.shape) + " axis " + std::to_string(p.axis);
      c.feeds = {{"x", data(p.shape, DType::f32, 9, 1.5, false)}};
      c.build = [p, family](Graph& g) {
        ValueId x = g.input("x", {DType::f32, p.shape});
        Attrs a{{"axis", p.axis}, {"group_size", p.group}};
        const std::string f = family;
        auto packed = g.apply(f + "_quantize_pack", {x}, a);
        Attrs u = a;
        u.set("shape", p.shape);
        if (f == "int4")
          g.apply("int4_unpack_dequantize", {packed[0], packed[1], packed[2]}, u);
        else
          g.apply("nf4_unpack_dequantize", {packed[0], packed[1]}, u);
      };
      expect_same_for_every_thread_count(c);
    }
}

}  // namespace
}  // namespace qg
