// Batches of fixed-length token windows for a language model, from one token stream.
// Training draws random crops: each row's start is uniform over every position where a whole
// window fits, from a seeded nn::Rng whose state saves to text (a checkpoint holds it, so a
// resumed run draws the crops the uninterrupted one would). Validation reads fixed,
// non-overlapping windows [k * window, (k + 1) * window) in order, so every evaluation sees
// the same tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/rng.h"

namespace qg::nn {

class TokenCrops {
 public:
  // Keeps a reference to `tokens`. Throws qg::Error (op "data.loader") when the stream is
  // shorter than one window or window < 2.
  TokenCrops(const std::vector<int32_t>& tokens, int64_t window, uint64_t seed);
  // Fills i64 `ids` [rows, window] with `rows` crops.
  void fill(Tensor& ids);
  int64_t window() const { return window_; }
  std::string save_state() const { return rng_.save(); }
  void load_state(const std::string& text) { rng_.load(text); }

 private:
  const std::vector<int32_t>& tokens_;
  int64_t window_;
  Rng rng_;
};

// How many validation windows a stream of `tokens` ids holds, at most `max_windows`
// (<= 0: no cap).
int64_t validation_windows(int64_t tokens, int64_t window, int64_t max_windows);
// Fills i64 `ids` [rows, window] with windows first, first + 1, ... of `tokens`.
void fill_windows(const std::vector<int32_t>& tokens, int64_t first, Tensor& ids);

// The largest id of a stream (-1 when empty).
int32_t max_token_id(const std::vector<int32_t>& tokens);

}  // namespace qg::nn
