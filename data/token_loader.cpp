#include "data/token_loader.h"

#include <algorithm>

#include "core/error.h"

namespace qg::nn {
namespace {

void check_batch(const Tensor& ids, int64_t window) {
  QG_CHECK(ids.dtype() == DType::i64 && ids.shape().size() == 2 && ids.shape()[1] == window,
           "data.loader", "the batch must be i64 [rows, ", window, "], got ", ids.str());
}

}  // namespace

TokenCrops::TokenCrops(const std::vector<int32_t>& tokens, int64_t window, uint64_t seed)
    : tokens_(tokens), window_(window), rng_(seed) {
  QG_CHECK(window >= 2, "data.loader", "window ", window, " must be >= 2");
  QG_CHECK(static_cast<int64_t>(tokens.size()) >= window, "data.loader", "a stream of ",
           tokens.size(), " tokens is shorter than one window of ", window);
}

void TokenCrops::fill(Tensor& ids) {
  check_batch(ids, window_);
  const uint64_t starts = tokens_.size() - static_cast<uint64_t>(window_) + 1;
  int64_t* out = ids.data<int64_t>();
  for (int64_t r = 0; r < ids.shape()[0]; ++r) {
    const int32_t* src = tokens_.data() + rng_.below(starts);
    std::copy(src, src + window_, out + r * window_);
  }
}

int64_t validation_windows(int64_t tokens, int64_t window, int64_t max_windows) {
  const int64_t all = window > 0 ? tokens / window : 0;
  return max_windows > 0 ? std::min(all, max_windows) : all;
}

void fill_windows(const std::vector<int32_t>& tokens, int64_t first, Tensor& ids) {
  QG_CHECK(ids.shape().size() == 2, "data.loader", "the batch must be [rows, window], got ",
           ids.str());
  const int64_t rows = ids.shape()[0], window = ids.shape()[1];
  check_batch(ids, window);
  QG_CHECK(first >= 0 && (first + rows) * window <= static_cast<int64_t>(tokens.size()),
           "data.loader", "windows [", first, ", ", first + rows, ") of ", window,
           " tokens run past a stream of ", tokens.size());
  int64_t* out = ids.data<int64_t>();
  std::copy(tokens.begin() + first * window, tokens.begin() + (first + rows) * window, out);
}

int32_t max_token_id(const std::vector<int32_t>& tokens) {
  return tokens.empty() ? -1 : *std::max_element(tokens.begin(), tokens.end());
}

}  // namespace qg::nn
