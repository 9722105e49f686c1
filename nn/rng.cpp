#include "nn/rng.h"

#include <sstream>

#include "core/error.h"

namespace qg::nn {

uint64_t Rng::below(uint64_t n) {
  QG_CHECK(n > 0, "rng", "below(0)");
  // Rejection sampling: drop the top partial block so every residue is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t v;
  do v = engine_();
  while (v >= limit);
  return v % n;
}

std::vector<int64_t> Rng::permutation(int64_t n) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[below(static_cast<uint64_t>(i) + 1)]);
  return p;
}

std::string Rng::save() const {
  std::ostringstream os;
  os << engine_;
  return os.str();
}

void Rng::load(const std::string& text) {
  std::istringstream is(text);
  std::mt19937_64 e;
  is >> e;
  QG_CHECK(!is.fail(), "rng", "malformed random-engine state (", text.size(), " bytes)");
  engine_ = e;
}

}  // namespace qg::nn
