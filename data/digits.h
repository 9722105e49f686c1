// The UCI optical-recognition digits data (1797 8x8 images, pixel values 0..16, ten
// classes) as Debian's python3-sklearn ships it: a gzip CSV of 65 columns (64 pixels, then
// the label). Located by an explicit path, the QG_DIGITS_CSV environment variable, or the
// standard Debian install location; a missing file is a qg::Error naming the package.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qg::nn {

struct Dataset {
  int64_t features = 0;
  std::vector<float> x;         // [n, features], row-major
  std::vector<int64_t> labels;  // [n]
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

// `path` empty: $QG_DIGITS_CSV, then the Debian location of python3-sklearn's copy.
std::string find_digits_csv(const std::string& path = "");
// Pixels are scaled by 1/16 into [0, 1].
Dataset load_digits(const std::string& path = "");
// The rows of the (already gunzipped) CSV text; `file` names it in error messages.
Dataset parse_digits_csv(const std::string& text, const std::string& file);
// A seeded shuffle split: the first `test_fraction` of the permutation is the test set.
void split_dataset(const Dataset& all, double test_fraction, uint64_t seed, Dataset* train,
                   Dataset* test);

}  // namespace qg::nn
