// The digits loader: the real data, the seeded split, and clear errors for missing or
// malformed files.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <set>

#include "data/digits.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

void write_gz(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
}

// Sets QG_DIGITS_CSV for one scope and restores the caller's value afterwards (machines
// without python3-sklearn point the whole suite at a copy through it).
class ScopedDigitsEnv {
 public:
  explicit ScopedDigitsEnv(const std::string& value) {
    const char* old = std::getenv("QG_DIGITS_CSV");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("QG_DIGITS_CSV", value.c_str(), 1);
  }
  ~ScopedDigitsEnv() {
    if (had_)
      ::setenv("QG_DIGITS_CSV", old_.c_str(), 1);
    else
      ::unsetenv("QG_DIGITS_CSV");
  }

 private:
  bool had_ = false;
  std::string old_;
};

std::string tmp_path(const std::string& name) {
  return ::testing::TempDir() + "/qg_digits_" + name;
}

TEST(Digits, LoadsTheRealUciData) {
  nn::Dataset d = nn::load_digits();
  ASSERT_EQ(d.size(), 1797);
  EXPECT_EQ(d.features, 64);
  EXPECT_EQ(d.x.size(), 1797u * 64u);
  std::set<int64_t> labels(d.labels.begin(), d.labels.end());
  EXPECT_EQ(labels, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // The first image of the UCI set starts 0,0,5,13,9,1 (scaled by 1/16) and is a 0.
  EXPECT_FLOAT_EQ(d.x[2], 5.0f / 16.0f);
  EXPECT_FLOAT_EQ(d.x[3], 13.0f / 16.0f);
  EXPECT_EQ(d.labels[0], 0);
  for (float v : d.x) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
}

TEST(Digits, SplitIsSeededDisjointAndComplete) {
  nn::Dataset d = nn::load_digits(), tr1, te1, tr2, te2, tr3, te3;
  nn::split_dataset(d, 0.2, 0, &tr1, &te1);
  nn::split_dataset(d, 0.2, 0, &tr2, &te2);
  nn::split_dataset(d, 0.2, 5, &tr3, &te3);
  EXPECT_EQ(te1.size(), 359);
  EXPECT_EQ(tr1.size(), 1438);
  EXPECT_EQ(te1.x, te2.x);
  EXPECT_EQ(tr1.labels, tr2.labels);
  EXPECT_NE(te1.x, te3.x);
  // The fixed split itself (bench/pytorch_qat_digits.py reproduces it with a Python port of
  // mt19937_64 and printed these first test labels).
  EXPECT_EQ(std::vector<int64_t>(te1.labels.begin(), te1.labels.begin() + 12),
            (std::vector<int64_t>{6, 0, 7, 1, 2, 5, 3, 1, 0, 6, 0, 3}));
  // Every row lands in exactly one side: the label histograms add up.
  std::vector<int> count(10, 0), all(10, 0);
  for (auto l : tr1.labels) ++count[l];
  for (auto l : te1.labels) ++count[l];
  for (auto l : d.labels) ++all[l];
  EXPECT_EQ(count, all);
  expect_error([&] { nn::split_dataset(d, 1.0, 0, &tr1, &te1); }, {"test fraction", "1"});
}

TEST(Digits, MissingFileNamesThePackage) {
  expect_error([] { nn::load_digits("/nonexistent/digits.csv.gz"); },
               {"/nonexistent/digits.csv.gz", "cannot be read"});
  {
    ScopedDigitsEnv env("/nonexistent/env.csv.gz");
    expect_error([] { nn::load_digits(); }, {"QG_DIGITS_CSV", "/nonexistent/env.csv.gz"});
  }
  // The default location's message (whether or not it exists here) names the package.
  {
    ScopedDigitsEnv env("");
    try {
      nn::find_digits_csv();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("apt-get install python3-sklearn"), std::string::npos);
    }
  }
}

TEST(Digits, EnvironmentVariableSelectsTheFile) {
  std::string p = tmp_path("env.csv.gz");
  std::string row;
  for (int i = 0; i < 64; ++i) row += std::to_string(i % 17) + ",";
  write_gz(p, row + "7\n" + row + "3\n");
  nn::Dataset d;
  {
    ScopedDigitsEnv env(p);
    d = nn::load_digits();
  }
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(d.labels, (std::vector<int64_t>{7, 3}));
  EXPECT_FLOAT_EQ(d.x[16], 16.0f / 16.0f);
}

TEST(Digits, MalformedFilesAreErrors) {
  std::string p = tmp_path("bad.csv.gz");
  write_gz(p, "1,2,3\n");
  expect_error([&] { nn::load_digits(p); }, {"line 1", "3 columns", "expected 65"});
  std::string row;
  for (int i = 0; i < 64; ++i) row += "1,";
  write_gz(p, row + "12\n");
  expect_error([&] { nn::load_digits(p); }, {"label 12"});
  write_gz(p, "17," + row.substr(2) + "1\n");
  expect_error([&] { nn::load_digits(p); }, {"pixel 0", "17"});
  write_gz(p, "x," + row.substr(2) + "1\n");
  expect_error([&] { nn::load_digits(p); }, {"'x' is not a number"});
  write_gz(p, "");
  expect_error([&] { nn::load_digits(p); }, {"no rows"});
  // A gzip stream cut in the middle.
  std::string q = tmp_path("cut.csv.gz");
  {
    std::string big;
    for (int r = 0; r < 200; ++r) big += row + "1\n";
    write_gz(q, big);
    FILE* f = std::fopen(q.c_str(), "rb");
    std::string bytes;
    int c;
    while ((c = std::fgetc(f)) != EOF) bytes.push_back(static_cast<char>(c));
    std::fclose(f);
    f = std::fopen(q.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size() / 2, f);
    std::fclose(f);
  }
  expect_error([&] { nn::load_digits(q); }, {"cut.csv.gz"});
}

}  // namespace
}  // namespace qg
