#include "data/digits.h"

#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/printable.h"
#include "nn/rng.h"

namespace qg::nn {
namespace {

// Where Debian's python3-sklearn installs its bundled data (the package is architecture-
// independent, so this path does not vary between machines).
const char* const kDebianDigits =
    "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

bool readable(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return f.good();
}

std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  QG_CHECK(f != nullptr, "digits", "cannot open '", path, "'");
  std::string out;
  char buf[1 << 15];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string what = msg ? msg : "";
  gzclose(f);
  QG_CHECK(n == 0 && (err == Z_OK || err == Z_STREAM_END), "digits", "'", path,
           "' is not a readable gzip file: ", what);
  return out;
}

}  // namespace

std::string find_digits_csv(const std::string& path) {
  if (!path.empty()) {
    QG_CHECK(readable(path), "digits", "the digits data file '", path, "' cannot be read");
    return path;
  }
  if (const char* env = std::getenv("QG_DIGITS_CSV"); env != nullptr && *env != '\0') {
    QG_CHECK(readable(env), "digits", "QG_DIGITS_CSV='", env, "' cannot be read");
    return env;
  }
  QG_CHECK(readable(kDebianDigits), "digits",
           "the UCI digits data (digits.csv.gz) was not found at ", kDebianDigits,
           ": install it with `apt-get install python3-sklearn`, or point ",
           "--data or QG_DIGITS_CSV at a copy");
  return kDebianDigits;
}

Dataset parse_digits_csv(const std::string& text, const std::string& file) {
  Dataset d;
  d.features = 64;
  std::istringstream lines(text);
  std::string line;
  int64_t row = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line == "\r") continue;
    ++row;
    std::istringstream cells(line);
    std::string cell;
    std::vector<double> v;
    while (std::getline(cells, cell, ',')) {
      char* end = nullptr;
      double x = std::strtod(cell.c_str(), &end);
      QG_CHECK(end != cell.c_str(), "digits", file, " line ", row, ": '", printable(cell),
               "' is not a number");
      v.push_back(x);
      // A line of garbage commas must not grow without bound before the count is checked.
      QG_CHECK(v.size() <= 65, "digits", file, " line ", row,
               " has more than 65 columns (64 pixels and a label)");
    }
    QG_CHECK(v.size() == 65, "digits", file, " line ", row, " has ", v.size(),
             " columns, expected 65 (64 pixels and a label)");
    for (int i = 0; i < 64; ++i) {
      QG_CHECK(v[i] >= 0 && v[i] <= 16, "digits", file, " line ", row, ": pixel ", i, " = ", v[i],
               " is outside 0..16");
      d.x.push_back(static_cast<float>(v[i] / 16.0));
    }
    QG_CHECK(v[64] >= 0 && v[64] <= 9 && v[64] == static_cast<int64_t>(v[64]), "digits", file,
             " line ", row, ": label ", v[64], " is not a digit");
    d.labels.push_back(static_cast<int64_t>(v[64]));
  }
  QG_CHECK(d.size() > 0, "digits", file, " holds no rows");
  return d;
}

Dataset load_digits(const std::string& path) {
  std::string file = find_digits_csv(path);
  return parse_digits_csv(gunzip_file(file), file);
}

void split_dataset(const Dataset& all, double test_fraction, uint64_t seed, Dataset* train,
                   Dataset* test) {
  QG_CHECK(test_fraction > 0 && test_fraction < 1, "digits", "test fraction ", test_fraction,
           " must be in (0, 1)");
  Rng rng(seed);
  std::vector<int64_t> perm = rng.permutation(all.size());
  int64_t n_test = static_cast<int64_t>(static_cast<double>(all.size()) * test_fraction + 0.5);
  *train = Dataset{all.features, {}, {}};
  *test = Dataset{all.features, {}, {}};
  for (int64_t k = 0; k < all.size(); ++k) {
    Dataset* dst = k < n_test ? test : train;
    int64_t i = perm[k];
    dst->x.insert(dst->x.end(), all.x.begin() + i * all.features,
                  all.x.begin() + (i + 1) * all.features);
    dst->labels.push_back(all.labels[i]);
  }
}

}  // namespace qg::nn
