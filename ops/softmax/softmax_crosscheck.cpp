// How `qat crosscheck` compares softmax: exp() of libm vs CUDA and the row sum (sequential on
// the CPU, a shuffle or block tree on the GPU); its backward: the row sum of dy * y.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

void add_softmax_crosscheck(OpRegistry& r) {
  for (const char* op : {"softmax", "softmax_backward"})
    crosscheck_spec::set_rounded_outputs(r, op, {-1},
                                         "exp of libm against CUDA's; row sums as trees");
}

}  // namespace qg
