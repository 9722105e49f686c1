// How `qat crosscheck` compares the fused ops that are not bit-identical to the CPU: those
// fused with batch_norm (every output depends on its statistics) and the scaled softmax (the
// mul is exact, the softmax part differs from the CPU as the plain op does).
#include "ops/common/crosscheck_inputs.h"

namespace qg {

void add_fused_crosscheck(OpRegistry& r) {
  for (const char* op : {"fused_channel_div_batch_norm", "fused_channel_div_batch_norm_backward"})
    crosscheck_spec::set_rounded_outputs(r, op, {-1},
                                         "batch-norm statistics: sums as trees on the GPU");
  for (const char* op : {"fused_scaled_softmax", "fused_scaled_softmax_backward"})
    crosscheck_spec::set_rounded_outputs(r, op, {-1},
                                         "exp of libm against CUDA's; row sums as trees");
}

}  // namespace qg
