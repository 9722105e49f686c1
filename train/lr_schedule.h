// The learning-rate schedule of language-model training: a linear warm-up to the peak, then
// a cosine decay to min_ratio * peak at the last step (as transformers'
// get_cosine_schedule_with_warmup, with a floor):
//   step < warmup:  peak * (step + 1) / warmup
//   otherwise:      floor + (peak - floor) * (1 + cos(pi * p)) / 2,
//                   p = (step - warmup) / max(1, total - 1 - warmup), clamped to [0, 1]
// `step` counts optimizer steps from 0.
//
// adam and adamw read their rate from a runtime variable (train/optimizer.h), so the trainer
// applies at(step) exactly with one compiled step. The sgd op takes its rate as an attribute
// (a constant of the compiled step), so there training applies the schedule in `levels`
// steps: applied(step) rounds the scheduled rate up to the next multiple of peak / levels,
// and the trainer recompiles its step (the states stay shared) whenever that value changes.
// Both are functions of the step alone, so a resumed run applies exactly the rates of the
// uninterrupted one.
#pragma once

#include <cstdint>

namespace qg::nn {

struct LrSchedule {
  double peak = 1e-3;
  int64_t warmup = 0;  // steps
  int64_t total = 1;   // steps of the whole run
  double min_ratio = 0.1;
  int levels = 32;

  double at(int64_t step) const;
  double applied(int64_t step) const;
  // Throws qg::Error (op "train.lr_schedule") naming the field out of range.
  void validate() const;
};

}  // namespace qg::nn
