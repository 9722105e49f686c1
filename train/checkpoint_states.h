// The trainers' model states in checkpoints: kept apart from train/checkpoint.h, whose file
// format the fuzzers build with core alone, because reading states needs the runtime.
#pragma once

#include <utility>
#include <vector>

#include "core/tensor.h"
#include "runtime/executor.h"
#include "train/checkpoint.h"

namespace qg::nn {

// The "state/<key>" section of every state of `exec` (runtime/compile.h's state_index),
// decoded and checked against the state's dtype and shape, as (destination, value) pairs:
// nothing is written, so a loader can check the whole file before it changes anything.
std::vector<std::pair<Tensor*, Tensor>> decode_states(Executor& exec,
                                                      const CheckpointSections& sections);

}  // namespace qg::nn
