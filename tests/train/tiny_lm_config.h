// The trainer tests' language model: the committed tiny Llama config (tests/train/fixtures,
// read through QG_TRAIN_TEST_DIR, which the test targets define), narrowed so a step takes
// milliseconds, with the schedule and batch those tests share.
#pragma once

#include <cstdint>
#include <string>

#include "nn/llama_config.h"
#include "train/lm_trainer.h"

namespace qg::testing {

inline const std::string kTinyLlamaFixture =
    std::string(QG_TRAIN_TEST_DIR) + "/fixtures/llama_tiny_config.json";

// `layers` blocks of `hidden` (intermediate `intermediate`) over `vocab` ids; batch 2 x 8
// tokens; LrSchedule {peak 3e-3, warm-up 2, 8 steps, min 0.1 x, 4 levels}; seed 5.
inline nn::LmTrainConfig tiny_lm_config(int64_t hidden, int64_t intermediate, int64_t layers,
                                        int64_t vocab = 32) {
  nn::LmTrainConfig c;
  c.model = nn::load_llama_config(kTinyLlamaFixture);
  c.model.vocab_size = vocab;
  c.model.hidden_size = hidden;
  c.model.intermediate_size = intermediate;
  c.model.num_hidden_layers = layers;
  c.batch = 2;
  c.seq = 8;
  c.lr = {3e-3, 2, 8, 0.1, 4};
  c.seed = 5;
  return c;
}

}  // namespace qg::testing
