// How `qat crosscheck` compares softmax: exp() of libm vs CUDA and the row sum (sequential on
// the CPU, a shuffle or block tree on the GPU); its backward: the row sum of dy * y.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

void add_softmax_crosscheck(OpRegistry& r) {
  crosscheck_spec::set_rounded_outputs(r, "softmax", {-1});
  crosscheck_spec::set_rounded_outputs(r, "softmax_backward", {-1});
}

}  // namespace qg
