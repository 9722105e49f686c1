// `qat crosscheck` cases and comparison of quantize to storage: token and group scopes with
// f64 scales and i64 zero points.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_quantize_crosscheck(OpRegistry& r) {
  set_cases(r, "quantize", [] {
    return std::vector<CrosscheckCase>{
        {"token [6,7,33] u8",
         {x_in({6, 7, 33}), fixed({6, 7, 1}, DType::f32, 0.01, 0.03),
          fixed({6, 7, 1}, DType::i32, 100, 150)},
         {{"scope", "token"}},
         true},
        {"group 16 axis 0 [40,3] s8 edges",
         {x_in({40, 3}), fixed({3, 3}, DType::f64, 0.05, 0.1), fixed({3, 3}, DType::i64, -3, 3)},
         {{"scope", "group"}, {"axis", 0}, {"group_size", 16}, {"signed", true}},
         true},
        // Runs of 8 elements under one qparam (the CUDA kernel's one-qparam-per-byte path):
        // a per-row quantizer of a [rows, 64] matrix and groups of 32 along its rows, with
        // NaN, infinities and out-of-range values, as the integer forward quantizes.
        {"channel axis 0 [37,64] s8",
         {GradcheckInput({37, 64}, DType::f64, 0, 0, with_non_finite(37 * 64)),
          fixed({37}, DType::f32, 0.01, 0.05), fixed({37}, DType::i32, -128, 127)},
         {{"scope", "channel"}, {"axis", 0}, {"quant_min", -128}, {"quant_max", 127}},
         true},
        {"group 32 axis 1 [5,128] s4 in i8",
         {x_in({5, 128}, -2, 2), fixed({5, 4}, DType::f32, 0.1, 0.3),
          fixed({5, 4}, DType::i32, 0, 0)},
         {{"scope", "group"},
          {"axis", 1},
          {"group_size", 32},
          {"quant_min", -8},
          {"quant_max", 7},
          {"out_dtype", std::string("i8")}},
         true}};
  });
  set_rounded_outputs(r, "dequantize_backward", {1}, "dscale: a float sum over the scope");
}

}  // namespace qg
