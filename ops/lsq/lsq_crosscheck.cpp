// How `qat crosscheck` compares lsq_backward: dscale and dzero_point are float sums over the
// scope, in another order on the GPU (trees) than on the CPU (sequential).
#include "ops/common/crosscheck_inputs.h"

namespace qg {

void add_lsq_crosscheck(OpRegistry& r) {
  crosscheck_spec::set_rounded_outputs(
      r, "lsq_backward", {1, 2},
      "dscale and dzero_point: float sums over the scope, as trees on the GPU");
}

}  // namespace qg
