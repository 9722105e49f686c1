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
         true}};
  });
  set_rounded_outputs(r, "dequantize_backward", {1}, "dscale: a float sum over the scope");
}

}  // namespace qg
