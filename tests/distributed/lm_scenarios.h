// The language-model scenarios of dist_worker (nn::LmTrainer, data parallel): a tiny Llama on
// a synthetic token stream, trained by 1, 2 or 3 ranks on one global batch.
#pragma once

#include <ostream>
#include <string>

#include "device/communicator.h"

namespace qg::testing {

// Runs `scenario` when it is one of these (returns false otherwise):
//   lm_train <recipe>   float, w8a8, 8da4w or float_bf16_reduce (float, gradients all-reduced
//                       in bf16): 5 steps on a global batch of 6 crops; per step
//                       the global loss and the state digest, then the validation loss.
//   lm_checkpoint save  3 steps, rank 0 writes <dir>/lm.qgck, then 2 more steps' losses.
//   lm_checkpoint resume  loads <dir>/lm.qgck and prints the next 2 steps' losses.
// `comm` is null for one process.
bool run_lm_scenario(const std::string& scenario, Communicator* comm, const std::string& dir,
                     const std::string& arg, std::ostream& out);

}  // namespace qg::testing
