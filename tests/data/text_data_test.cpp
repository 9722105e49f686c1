// The language-model data path: the corpus split, the SentencePiece tokenizer, the token
// cache and the crop loader, with a named error for each bad input. Tests that need
// SentencePiece or Debian's python3.11-doc skip, saying which, where they are missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/text_corpus.h"
#include "data/token_data.h"
#include "data/token_loader.h"
#include "data/tokenizer.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

// A scratch folder removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& suffix = "") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           (std::string("qg_text_") + info->test_suite_name() + "_" + info->name() + suffix);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((path / rel).parent_path());
    std::ofstream(path / rel, std::ios::binary) << text;
  }
  std::string str() const { return path.string(); }
};

const std::string kTutorial = nn::default_text_corpus_dir() + "/tutorial";

#define SKIP_WITHOUT_SENTENCEPIECE()                     \
  if (!nn::tokenizer_available())                        \
  GTEST_SKIP() << "built without SentencePiece (Debian " \
                  "libsentencepiece-dev)"
#define SKIP_WITHOUT_CORPUS()            \
  if (!fs::is_directory(kTutorial))      \
  GTEST_SKIP() << kTutorial              \
               << " is missing (Debian " \
                  "python3.11-doc)"

TEST(TextCorpus, HoldsOutEveryTwentiethFileBySortedName) {
  TempDir d;
  for (int i = 0; i < 41; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "part%02d/doc%02d.rst.txt", i % 3, i);
    d.write(name, "text " + std::to_string(i) + "\n");
  }
  d.write("notes.txt", "not a source");  // other suffixes are not corpus files
  nn::CorpusSplit s = nn::split_text_corpus(d.str());
  ASSERT_EQ(s.train.size() + s.validation.size(), 41u);
  ASSERT_EQ(s.validation.size(), 3u);  // indices 0, 20, 40 of the sorted relative names
  EXPECT_NE(s.validation[0].find("part00/doc00.rst.txt"), std::string::npos);
  EXPECT_NE(s.validation[1].find("part01/doc19.rst.txt"), std::string::npos);
  EXPECT_NE(s.validation[2].find("part02/doc38.rst.txt"), std::string::npos);
  for (const std::string& v : s.validation)
    EXPECT_EQ(std::count(s.train.begin(), s.train.end(), v), 0) << v;
}

TEST(TextCorpus, BadFoldersAreNamedErrors) {
  TempDir d;
  expect_error([&] { nn::split_text_corpus(d.str() + "/absent"); },
               {"[data.corpus]", "absent", "is not a directory", "python3.11-doc"});
  d.write("readme.txt", "no sources here");
  expect_error([&] { nn::split_text_corpus(d.str()); }, {"[data.corpus]", "holds no .rst.txt"});
  d.write("a.rst.txt", "");
  expect_error([&] { nn::split_text_corpus(d.str()); }, {"[data.corpus]", "needs at least 2"});
  d.write("b.rst.txt", "");
  expect_error([&] { nn::split_text_corpus(d.str()); },
               {"[data.corpus]", "training file(s)", "are empty"});
}

TEST(TokenFile, RoundTripsAndRejectsStaleOrDamagedFiles) {
  TempDir d;
  const std::string path = d.str() + "/x.tokens";
  std::vector<int32_t> ids = {5, 0, 511, 7}, back;
  EXPECT_FALSE(nn::read_token_file(path, 42, &back));  // absent
  nn::write_token_file(path, 42, ids);
  ASSERT_TRUE(nn::read_token_file(path, 42, &back));
  EXPECT_EQ(back, ids);
  EXPECT_FALSE(nn::read_token_file(path, 43, &back));  // another model or corpus
  fs::resize_file(path, fs::file_size(path) - 2);
  expect_error([&] { nn::read_token_file(path, 42, &back); },
               {"[data.tokens]", "x.tokens", "truncated", "declares 4 ids"});
  d.write("y.tokens", "garbage");
  expect_error([&] { nn::read_token_file(d.str() + "/y.tokens", 42, &back); },
               {"[data.tokens]", "is not a token file"});
}

TEST(TokenCrops, SeededResumableAndInsideTheStream) {
  std::vector<int32_t> stream(1000);
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = static_cast<int32_t>(i);
  nn::TokenCrops a(stream, 16, 9), b(stream, 16, 9);
  Tensor x = Tensor::empty({4, 16}, DType::i64), y = Tensor::empty({4, 16}, DType::i64);
  a.fill(x);
  const std::string state = a.save_state();
  a.fill(x);
  b.load_state(state);
  b.fill(y);
  EXPECT_EQ(x.to_doubles(), y.to_doubles());  // the resumed sampler draws the same crops
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t* row = x.data<int64_t>() + r * 16;
    EXPECT_GE(row[0], 0);
    EXPECT_LE(row[0], 1000 - 16);
    for (int i = 1; i < 16; ++i) EXPECT_EQ(row[i], row[0] + i);  // one contiguous crop
  }
  nn::TokenCrops other(stream, 16, 10);
  other.fill(y);
  EXPECT_NE(x.to_doubles(), y.to_doubles());
  expect_error([&] { nn::TokenCrops(std::vector<int32_t>(5, 1), 16, 0); },
               {"[data.loader]", "5 tokens is shorter than one window of 16"});
  expect_error(
      [&] {
        a.fill(y = Tensor::empty({4, 8}, DType::i64));
      },
      {"[data.loader]", "i64 [rows, 16]"});
}

TEST(TokenWindows, FixedNonOverlappingWindows) {
  std::vector<int32_t> stream(100);
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = static_cast<int32_t>(i);
  EXPECT_EQ(nn::validation_windows(100, 16, 0), 6);
  EXPECT_EQ(nn::validation_windows(100, 16, 4), 4);
  Tensor x = Tensor::empty({2, 16}, DType::i64);
  nn::fill_windows(stream, 2, x);
  EXPECT_EQ(x.data<int64_t>()[0], 32);
  EXPECT_EQ(x.data<int64_t>()[31], 63);
  expect_error([&] { nn::fill_windows(stream, 5, x); },
               {"[data.loader]", "windows [5, 7) of 16 tokens run past a stream of 100"});
  EXPECT_EQ(nn::max_token_id(stream), 99);
}

TEST(Tokenizer, UnreadableOrCorruptModelsAreNamedErrors) {
  SKIP_WITHOUT_SENTENCEPIECE();
  TempDir d;
  expect_error([&] { nn::Tokenizer::load(d.str() + "/absent.model"); },
               {"[data.tokenizer]", "absent.model"});
  d.write("corrupt.model", "this is not a protobuf \xff\xfe");
  expect_error([&] { nn::Tokenizer::load(d.str() + "/corrupt.model"); },
               {"[data.tokenizer]", "corrupt.model", "is not a SentencePiece model"});
}

// count_model_pieces reads the model's size from the protobuf wire format alone; it must
// agree with the library on a real model and name malformed bytes.
// count_model_pieces reads a model's size from the protobuf wire format alone (the
// TokenData test checks it against the library on a trained model): field 1 is a piece,
// other fields of every wire type are skipped, malformed bytes are named.
TEST(Tokenizer, PiecesAreCountedFromTheModelBytes) {
  // piece "abc", a varint field 2, piece "x", a 4-byte field 3, an 8-byte field 4.
  const std::string model(
      "\x0a\x03"
      "abc"
      "\x10\x96\x01"
      "\x0a\x01"
      "x"
      "\x1d\x01\x02\x03\x04"
      "\x21\x01\x02\x03\x04\x05\x06\x07\x08",
      25);
  EXPECT_EQ(nn::count_model_pieces(model, "hand.model"), 2);
  expect_error([] { nn::count_model_pieces("", "empty.model"); },
               {"[data.tokenizer]", "empty.model", "holds no piece"});
  expect_error([] { nn::count_model_pieces(std::string("\x0a\xff", 2), "cut.model"); },
               {"[data.tokenizer]", "cut.model", "malformed field at byte 0"});
  expect_error([] { nn::count_model_pieces(std::string("\x0f\x01", 2), "wire.model"); },
               {"[data.tokenizer]", "wire.model", "malformed"});
  expect_error([&] { nn::count_model_pieces(model.substr(0, 12), "short.model"); },
               {"[data.tokenizer]", "short.model", "malformed field at byte 11"});
}

TEST(Tokenizer, WithoutSentencePieceEveryCallSaysSo) {
  if (nn::tokenizer_available()) GTEST_SKIP() << "this build has SentencePiece";
  expect_error([] { nn::Tokenizer::load("any.model"); },
               {"[data.tokenizer]", "no SentencePiece", "libsentencepiece-dev"});
}

// Trains a small BPE model on the tutorial's training split, encodes it, and checks the
// cache: a second call reads the ids instead of encoding again.
TEST(TokenData, TrainsTheTokenizerOnceAndCachesTheIds) {
  SKIP_WITHOUT_SENTENCEPIECE();
  SKIP_WITHOUT_CORPUS();
  TempDir d;
  nn::TokenData first = nn::prepare_token_data(kTutorial, d.str(), 256);
  EXPECT_TRUE(first.trained_tokenizer);
  EXPECT_TRUE(first.encoded);
  EXPECT_EQ(first.vocab_size, 256);
  EXPECT_EQ(first.validation_files, 1);  // 17 files: index 0 is held out
  EXPECT_GT(first.train.size(), 50000u);
  EXPECT_GT(first.validation.size(), 1000u);
  EXPECT_LT(nn::max_token_id(first.train), 256);
  nn::TokenData second = nn::prepare_token_data(kTutorial, d.str(), 256);
  EXPECT_FALSE(second.trained_tokenizer);
  EXPECT_FALSE(second.encoded);
  EXPECT_EQ(second.train, first.train);
  EXPECT_EQ(second.validation, first.validation);
  EXPECT_EQ(second.vocab_size, 256);  // counted in the model file, the library not loaded
  // A copy of the corpus at another path keeps the cache: the key holds relative names.
  TempDir copy("_copy");
  fs::copy(kTutorial, copy.path / "tutorial", fs::copy_options::recursive);
  nn::TokenData moved = nn::prepare_token_data((copy.path / "tutorial").string(), d.str(), 256);
  EXPECT_FALSE(moved.encoded);
  EXPECT_EQ(moved.train, first.train);
  // The encoder itself: text round-trips through pieces of the model.
  nn::Tokenizer tok = nn::Tokenizer::load(first.tokenizer_path);
  std::vector<int32_t> ids = tok.encode("The Python tutorial");
  EXPECT_FALSE(ids.empty());
  std::string text;
  for (int32_t id : ids) text += tok.piece(id);
  EXPECT_EQ(text, "\xe2\x96\x81The\xe2\x96\x81Python\xe2\x96\x81tutorial");  // U+2581 spaces
  // A corrupt tokenizer model in the data folder is named, not retrained over.
  d.write("tokenizer.model", "corrupt");
  expect_error([&] { nn::prepare_token_data(kTutorial, d.str(), 256); },
               {"[data.tokenizer]", "tokenizer.model", "is not a SentencePiece model"});
}

}  // namespace
}  // namespace qg
