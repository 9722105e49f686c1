// `qat crosscheck` cases of NF4: quantize + pack (groups with a tail, both nibble orders, a
// leading axis, edges), unpack, and the double quantization of the absmax values.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_nf4_crosscheck(OpRegistry& r) {
  set_cases(r, "nf4_quantize_pack", [] {
    return std::vector<CrosscheckCase>{
        {"g64 [33,300]", {x_in({33, 300})}, {}},
        {"g32 [7,101] high_first (tail group)",
         {x_in({7, 101}, -1, 4)},
         {{"group_size", 32}, {"nibble_order", "high_first"}}},
        {"axis 0 g3 [10,5] (odd bytes)", {x_in({10, 5})}, {{"axis", 0}, {"group_size", 3}}},
        {"edges g8", {edges_in()}, {{"group_size", 8}}},
    };
  });
  set_cases(r, "nf4_unpack_dequantize", [] {
    return std::vector<CrosscheckCase>{
        {"g16 [6,35] low_first",
         {fixed({105}, DType::u8, 0, 255.99), fixed({6, 3}, DType::f32, 0.01, 2.0)},
         {{"shape", Shape{6, 35}}, {"group_size", 16}},
         false,
         0,
         2,
         true},
        {"f64 absmax -> bf16 [4,9] high_first",
         {fixed({18}, DType::u8, 0, 255.99), fixed({4, 1}, DType::f64, 0.01, 2.0)},
         {{"shape", Shape{4, 9}},
          {"group_size", 16},
          {"nibble_order", "high_first"},
          {"dtype", "bf16"}},
         false,
         0,
         2,
         true},
    };
  });
  set_cases(r, "nf4_double_quantize", [] {
    return std::vector<CrosscheckCase>{{"1000 absmax, blocks of 256",
                                        {fixed({1000}, DType::f32, 0.01, 3.0)},
                                        {{"block_size", 256}},
                                        false,
                                        0,
                                        2,
                                        true}};
  });
  set_cases(r, "nf4_double_dequantize", [] {
    return std::vector<CrosscheckCase>{
        {"1000 codes, blocks of 256",
         {fixed({1000}, DType::u8, 0, 255.99), fixed({4}, DType::f32, 0.001, 0.05),
          fixed({4}, DType::f32, 0.0, 0.5)},
         {{"block_size", 256}},
         false,
         0,
         2,
         true}};
  });
}

}  // namespace qg
