// `qat crosscheck` cases and comparison of the matrix products.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_linalg_crosscheck(OpRegistry& r) {
  set_cases(r, "matmul", [] {
    return std::vector<CrosscheckCase>{
        {"[129,257]@[257,65]", {x_in({129, 257}, -1, 1), x_in({257, 65}, -1, 1)}, {}, true},
        {"[257,129]^T@[65,257]^T",
         {x_in({257, 129}, -1, 1), x_in({65, 257}, -1, 1)},
         {{"transpose_a", true}, {"transpose_b", true}},
         true}};
  });
  for (const char* op : {"matmul", "batched_matmul"})
    set_rounded_outputs(r, op, {-1}, "cuBLAS's GEMM blocking sums in another order than Eigen's");
}

}  // namespace qg
