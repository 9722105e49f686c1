// Shared pieces of the nn tests: the digits split, small train configs per model kind.
#pragma once

#include "tests/core/test_util.h"
#include "train/trainer.h"

namespace qg::testing {

struct DigitsSplit {
  nn::Dataset train, test;
  DigitsSplit() { nn::split_dataset(nn::load_digits(), 0.2, 0, &train, &test); }
};
inline const DigitsSplit& digits() {
  static const DigitsSplit split;
  return split;
}

// The first `n` rows of `d`.
inline nn::Dataset head_rows(const nn::Dataset& d, int64_t n, int64_t skip = 0) {
  nn::Dataset out;
  out.features = d.features;
  out.x.assign(d.x.begin() + skip * d.features, d.x.begin() + (skip + n) * d.features);
  out.labels.assign(d.labels.begin() + skip, d.labels.begin() + skip + n);
  return out;
}

// Small models of each kind, sized for tests (seconds, also under ASan).
inline nn::TrainConfig small_config(const std::string& kind, nn::QConfig qc, uint64_t seed = 3) {
  nn::TrainConfig c;
  c.model = kind;
  c.mlp.hidden = {16};
  c.mlp.batch = 32;
  c.cnn.channels = {8, 16, 16};
  c.transformer.d_model = 16;
  c.transformer.heads = 2;
  c.transformer.mlp_hidden = 32;
  c.qconfig = qc;
  c.optimizer.lr = kind == "cnn" ? 1e-2 : 3e-3;  // as qat train's per-model defaults
  c.seed = seed;
  return c;
}

}  // namespace qg::testing
