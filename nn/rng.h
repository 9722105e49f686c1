// A seeded, portable random source: std::mt19937_64 (whose sequence the standard fixes)
// with our own conversion to doubles, because std::uniform_real_distribution's output is
// implementation-defined. Its state round-trips through text for checkpoints.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace qg::nn {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  uint64_t below(uint64_t n);  // unbiased integer in [0, n)
  // Fisher-Yates shuffle of 0..n-1.
  std::vector<int64_t> permutation(int64_t n);

  std::string save() const;
  void load(const std::string& text);  // throws qg::Error on malformed state

 private:
  std::mt19937_64 engine_;
};

}  // namespace qg::nn
