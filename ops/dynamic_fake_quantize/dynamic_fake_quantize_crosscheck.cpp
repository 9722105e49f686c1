// `qat crosscheck` cases of dynamic_fake_quantize beyond its gradient-check samples: the
// recipes' shapes (per-token int8 rows of 1024 and 2816, int4 groups of 32 of a weight),
// rows that are not a multiple of 32 (partial mask words), all-zero and one-signed rows
// (the eps floor and the zero point's clamp), a NaN in one row (both must raise), and the
// float zero point of the int4 weight-only recipe (bf16 qparams, groups of 32 to 256, odd
// groups, constant groups at the eps floor), and y narrowed to bf16/f16 from f32 (out_dtype).
#include "ops/common/crosscheck_inputs.h"

namespace qg {
namespace {

using namespace crosscheck_spec;

Attrs token8() {
  return {{"quant_min", -128}, {"quant_max", 127}};
}

Attrs group4(int64_t g) {
  return {
      {"group_size", g}, {"mode", std::string("symmetric")}, {"quant_min", -8}, {"quant_max", 7}};
}

Attrs float_zero4(int64_t g, const std::string& qparam_dtype) {
  return {{"group_size", g}, {"mode", std::string("float_zero")},
          {"quant_min", 0},  {"quant_max", 15},
          {"eps", 1e-6},     {"qparam_dtype", qparam_dtype}};
}

std::vector<CrosscheckCase> cases() {
  std::vector<CrosscheckCase> c;
  c.push_back({"token s8 [64,1024]", {x_in({64, 1024})}, token8(), true});
  c.push_back({"token s8 [3,5,2816]", {x_in({3, 5, 2816}, -0.5, 2)}, token8(), true});
  c.push_back({"token u8 [7,37]", {x_in({7, 37})}, {{"quant_min", 0}, {"quant_max", 255}}, true});
  c.push_back({"group 32 s4 symmetric [96,1024]", {x_in({96, 1024}, -0.2, 0.2)}, group4(32), true});
  c.push_back({"group 3 s4 symmetric [5,12]", {x_in({5, 12})}, group4(3), true});
  c.push_back({"per channel s8 symmetric [40,100]",
               {x_in({40, 100})},
               {{"mode", std::string("symmetric")}, {"quant_min", -128}, {"quant_max", 127}},
               true});
  std::vector<double> rows(4 * 40, 0.0);  // zeros; then positive, negative and tiny rows
  for (int i = 0; i < 40; ++i) {
    rows[40 + i] = 0.5 + 0.01 * i;
    rows[80 + i] = -0.5 - 0.01 * i;
    rows[120 + i] = 1e-9 * (i - 20);
  }
  c.push_back(
      {"zero, one-signed and tiny rows", {fixed({4, 40}, DType::f64, 0, 0, rows)}, token8(), true});
  c.push_back({"group 32 float_zero u4 bf16 qparams [96,1024]",
               {x_in({96, 1024}, -0.2, 0.3)},
               float_zero4(32, "bf16"),
               true});
  c.push_back(
      {"group 256 float_zero u4 [48,512]", {x_in({48, 512})}, float_zero4(256, "input"), true});
  c.push_back(
      {"group 3 float_zero u4 bf16 qparams [5,12]", {x_in({5, 12})}, float_zero4(3, "bf16"), true});
  std::vector<double> flat(2 * 64, 0.25);  // constant groups: the eps floor
  for (int i = 0; i < 32; ++i) flat[64 + i] = -3.0;
  c.push_back({"float_zero constant groups",
               {fixed({2, 64}, DType::f64, 0, 0, flat)},
               float_zero4(32, "bf16"),
               true});
  // out_dtype: an f32 weight fake-quantized straight into a mixed-precision GEMM's dtype.
  auto narrowed = [](Attrs a, const char* to) {
    a.set("out_dtype", std::string(to));
    return a;
  };
  c.push_back({"group 32 s4 symmetric f32 -> bf16 [96,1024]",
               {x_in({96, 1024}, -0.2, 0.2)},
               narrowed(group4(32), "bf16"),
               true,
               0,
               2,
               true});
  c.push_back(
      {"token s8 f32 -> f16 [7,37]", {x_in({7, 37})}, narrowed(token8(), "f16"), true, 0, 2, true});
  c.push_back({"group 32 float_zero u4 f32 -> bf16 [48,512]",
               {x_in({48, 512})},
               narrowed(float_zero4(32, "bf16"), "bf16"),
               true,
               0,
               2,
               true});
  c.push_back({"NaN and Inf rows (both must raise)",
               {fixed({4, 30}, DType::f64, 0, 0, with_non_finite(120))},
               token8(),
               false});
  return c;
}

}  // namespace

void add_dynamic_fake_quantize_crosscheck(OpRegistry& r) {
  set_cases(r, "dynamic_fake_quantize", cases);
}

}  // namespace qg
