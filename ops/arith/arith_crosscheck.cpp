// `qat crosscheck` cases and comparison of the arithmetic ops: broadcasting and sizes that
// need several blocks and vector tails.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_arith_crosscheck(OpRegistry& r) {
  set_cases(r, "add", [] {
    return std::vector<CrosscheckCase>{
        {"broadcast [129,1,67]+[33,67]", {x_in({129, 1, 67}), x_in({33, 67})}, {}, true}};
  });
  set_cases(r, "mul", [] {
    return std::vector<CrosscheckCase>{
        {"same [1000003]", {x_in({1000003}), x_in({1000003})}, {}, true}};
  });
  set_cases(r, "sub", [] {
    return std::vector<CrosscheckCase>{
        {"bcast [513]-[7,1]", {x_in({513}), x_in({7, 1})}, {}, true}};
  });
  set_rounded_outputs(r, "sum_to", {-1},
                      "a float reduction: sequential on the CPU, trees on the GPU");
}

}  // namespace qg
