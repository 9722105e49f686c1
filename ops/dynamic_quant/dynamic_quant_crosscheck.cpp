// `qat crosscheck` cases of dynamic_range_quantize: edges, both modes, every scope, zeros.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_dynamic_quant_crosscheck(OpRegistry& r) {
  set_cases(r, "dynamic_range_quantize", [] {
    return std::vector<CrosscheckCase>{
        {"tensor symmetric edges", {edges_in()}, {}},
        {"tensor affine [257,1031]",
         {x_in({257, 1031}, -1, 5)},
         {{"mode", "affine"}, {"signed", false}, {"narrow_range", false}}},
        {"channel axis 0 [64,300]", {x_in({64, 300})}, {{"scope", "channel"}, {"axis", 0}}},
        {"token [5,7,129] affine",
         {x_in({5, 7, 129}, -2, 1)},
         {{"scope", "token"}, {"mode", "affine"}}},
        {"group 32 [9,100]",
         {x_in({9, 100})},
         {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}},
        {"all zeros",
         {GradcheckInput({2, 8}, DType::f64, 0, 0, std::vector<double>(16, 0.0))},
         {{"scope", "token"}}}};
  });
}

}  // namespace qg
