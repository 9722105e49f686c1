// `qat crosscheck` cases of pooling: sizes that need several blocks, ceil mode and padding,
// and NaN and Inf in the windows.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_pool_crosscheck(OpRegistry& r) {
  set_cases(r, "max_pool2d", [] {
    return std::vector<CrosscheckCase>{
        {"k3 s2 p1 ceil [8,16,33,35]",
         {x_in({8, 16, 33, 35})},
         {{"kernel", Shape{3, 3}},
          {"stride", Shape{2, 2}},
          {"padding", Shape{1, 1}},
          {"ceil_mode", true}},
         true},
        {"NaN/Inf k2 [1,2,13,13]",
         {GradcheckInput({1, 2, 13, 13}, DType::f64, 0, 0, with_non_finite(338))},
         {{"kernel", Shape{2, 2}}, {"stride", Shape{1, 1}}},
         false}};
  });
  set_cases(r, "avg_pool2d", [] {
    return std::vector<CrosscheckCase>{{"k3 s2 p1 ceil exclude-pad [8,16,33,35]",
                                        {x_in({8, 16, 33, 35})},
                                        {{"kernel", Shape{3, 3}},
                                         {"stride", Shape{2, 2}},
                                         {"padding", Shape{1, 1}},
                                         {"ceil_mode", true},
                                         {"count_include_pad", false}},
                                        true}};
  });
  set_cases(r, "global_avg_pool2d", [] {
    return std::vector<CrosscheckCase>{{"[32,256,7,7]", {x_in({32, 256, 7, 7})}, {}, true}};
  });
}

}  // namespace qg
