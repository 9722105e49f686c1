// `qat crosscheck` cases and comparison of softmax cross-entropy: many classes, a 32k
// vocabulary (CUDA holds such rows in registers) and a row just too long for that, i32
// labels, and a label out of range (both backends must raise).
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_loss_crosscheck(OpRegistry& r) {
  set_cases(r, "softmax_cross_entropy", [] {
    return std::vector<CrosscheckCase>{
        {"[300,1000]", {x_in({300, 1000}, -4, 4), fixed({300}, DType::i64, 0, 999.99)}, {}, true},
        {"[24,32000] (rows in registers)",
         {x_in({24, 32000}, -8, 8), fixed({24}, DType::i64, 0, 31999.99)},
         {},
         true},
        {"[5,32776] (a row past the registers)",
         {x_in({5, 32776}, -8, 8), fixed({5}, DType::i64, 0, 32775.99)},
         {},
         true},
        {"i32 labels sum [64,10]",
         {x_in({64, 10}, -4, 4), fixed({64}, DType::i32, 0, 9.99)},
         {{"reduction", "sum"}},
         true},
        {"bad label (both must raise)",
         {x_in({3, 4}), fixed({3}, DType::i64, 0, 0, {0, 4, 1})},
         {},
         true}};
  });
  set_rounded_outputs(r, "softmax_cross_entropy", {-1},
                      "a float reduction over the classes and the batch");
  set_rounded_outputs(r, "softmax_cross_entropy_backward", {-1}, "exp of libm against CUDA's");
}

}  // namespace qg
