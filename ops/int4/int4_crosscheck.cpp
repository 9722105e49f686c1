// `qat crosscheck` cases of INT4: quantize + pack (both modes, both nibble orders, a leading
// axis, odd bytes, edges) and unpack.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_int4_crosscheck(OpRegistry& r) {
  set_cases(r, "int4_quantize_pack", [] {
    return std::vector<CrosscheckCase>{
        {"symmetric g128 [33,300]", {x_in({33, 300})}, {}},
        {"asymmetric g32 [7,101] high_first",
         {x_in({7, 101}, -1, 4)},
         {{"mode", "asymmetric"}, {"group_size", 32}, {"nibble_order", "high_first"}}},
        {"axis 0 g3 [10,5] (odd bytes)", {x_in({10, 5})}, {{"axis", 0}, {"group_size", 3}}},
        {"edges g8", {edges_in()}, {{"group_size", 8}}}};
  });
  set_cases(r, "int4_unpack_dequantize", [] {
    return std::vector<CrosscheckCase>{
        {"g16 [6,35] low_first",
         {fixed({105}, DType::u8, 0, 255.99), fixed({6, 3}, DType::f32, 0.01, 0.2),
          fixed({6, 3}, DType::u8, 0, 15.99)},
         {{"shape", Shape{6, 35}}, {"group_size", 16}},
         false,
         0,
         2,
         true},
        {"f64 scale -> f16 [4,9] high_first",
         {fixed({18}, DType::u8, 0, 255.99), fixed({4, 1}, DType::f64, 0.01, 0.2),
          fixed({4, 1}, DType::i32, 0, 15.99)},
         {{"shape", Shape{4, 9}},
          {"group_size", 16},
          {"nibble_order", "high_first"},
          {"dtype", "f16"}},
         false,
         0,
         2,
         true}};
  });
}

}  // namespace qg
