// How `qat crosscheck` compares the normalisations: their statistics are f64 sums in another
// order on the GPU (block trees over stretches) than on the CPU (sequential), and every output
// depends on them.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_norm_crosscheck(OpRegistry& r) {
  for (const char* op : {"batch_norm", "batch_norm_backward", "layer_norm", "layer_norm_backward"})
    set_rounded_outputs(r, op, {-1},
                        "mean, variance and their gradients: sums as trees on the GPU");
  set_rounded_outputs(r, "channel_div_backward", {1}, "ds: a per-channel f64 sum over N, H, W");
}

}  // namespace qg
