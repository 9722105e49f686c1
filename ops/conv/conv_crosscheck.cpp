// How `qat crosscheck` compares the convolutions: GEMMs (Eigen's summation order vs
// cuBLAS's), col2im's sums and the bias gradient's sum over N, Ho, Wo.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

void add_conv_crosscheck(OpRegistry& r) {
  for (const char* op :
       {"conv2d", "conv2d_backward_input", "conv2d_backward_weight", "conv2d_backward_bias"})
    crosscheck_spec::set_rounded_outputs(r, op, {-1},
                                         "GEMMs, col2im and bias sums in cuBLAS's order");
}

}  // namespace qg
