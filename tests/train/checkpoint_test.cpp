// Checkpoint format: round trip, and every truncation and every corrupted byte of a small
// real checkpoint is a qg::Error (never a crash) that leaves the trainer unchanged.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "tests/core/test_util.h"
#include "tests/train/train_util.h"
#include "train/checkpoint.h"

namespace qg {
namespace {

using testing::all_state_bytes;
using testing::DigitsFixture;
using testing::expect_error;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

class CheckpointTest : public ::testing::Test, public DigitsFixture {
 protected:
  // A small but complete training state: W8A8 (observers), Adam (moments, step), one epoch.
  std::unique_ptr<nn::Trainer> small_trainer() {
    auto t = std::make_unique<nn::Trainer>(config(nn::QConfig::w8a8(), 4), train, test);
    return t;
  }
};

TEST(CheckpointFormat, SectionsAndTensorsRoundTrip) {
  Tensor t = Tensor::from_doubles({2, 3}, {1, -2, 3.5, 0, 1e-3, 7});
  std::vector<nn::CheckpointSection> s = {{"a", "hello"}, {"", ""}, {"t", nn::encode_tensor(t)}};
  std::string bytes = nn::encode_checkpoint(s);
  std::vector<nn::CheckpointSection> back = nn::decode_checkpoint(bytes, "mem");
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].name, "a");
  EXPECT_EQ(back[0].payload, "hello");
  EXPECT_EQ(back[1].payload, "");
  Tensor u = nn::decode_tensor(back[2].payload, "t");
  EXPECT_EQ(u.shape(), t.shape());
  EXPECT_EQ(u.dtype(), DType::f32);
  EXPECT_EQ(u.to_doubles(), t.to_doubles());
  EXPECT_EQ(bytes.substr(0, 8), std::string("QGCKPT\r\n"));
}

TEST(CheckpointFormat, BadTensorPayloadsAreErrors) {
  std::string good = nn::encode_tensor(Tensor::from_doubles({2}, {1, 2}));
  expect_error([&] { nn::decode_tensor(good.substr(0, good.size() - 1), "x"); },
               {"x", "needs 8 data bytes", "holds 7"});
  std::string bad_dtype = good;
  bad_dtype[0] = 99;
  expect_error([&] { nn::decode_tensor(bad_dtype, "x"); }, {"unknown dtype code 99"});
  std::string huge = good;
  huge[2 + 7] = 0x7f;  // top byte of the first dim
  expect_error([&] { nn::decode_tensor(huge, "x"); }, {"implausible"});
  expect_error([&] { nn::decode_tensor("", "x"); }, {"truncated"});
}

TEST(CheckpointFormat, WriteIsAtomicAndLeavesNoTempFile) {
  std::string path = ::testing::TempDir() + "/qg_atomic.qgck";
  nn::write_checkpoint(path, {{"a", "1"}});
  nn::write_checkpoint(path, {{"a", "2"}});
  EXPECT_EQ(nn::read_checkpoint(path)[0].payload, "2");
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  expect_error([&] { nn::write_checkpoint("/nonexistent-dir/x.qgck", {}); },
               {"cannot create", "/nonexistent-dir/x.qgck.tmp"});
  std::remove(path.c_str());
}

TEST_F(CheckpointTest, EveryTruncationAndEveryCorruptedByteIsAnError) {
  auto t = small_trainer();
  t->train_epoch();
  std::string path = ::testing::TempDir() + "/qg_sweep.qgck";
  t->save_checkpoint(path);
  const std::string good = read_all(path);
  std::remove(path.c_str());
  ASSERT_GT(good.size(), 1000u);

  auto fresh = small_trainer();
  const std::vector<std::string> before = all_state_bytes(*fresh);
  int errors = 0;
  for (size_t len = 0; len < good.size(); ++len) {
    try {
      fresh->load_checkpoint_bytes(good.substr(0, len), "truncated");
      ADD_FAILURE() << "truncation at " << len << " bytes was accepted";
    } catch (const Error&) {
      ++errors;
    }
  }
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    try {
      fresh->load_checkpoint_bytes(bad, "corrupt");
      ADD_FAILURE() << "a corrupted byte at offset " << i << " was accepted";
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_EQ(errors, static_cast<int>(2 * good.size()));
  // Nothing half-loaded: the fresh trainer still holds its own initial state.
  EXPECT_EQ(all_state_bytes(*fresh), before);
  EXPECT_EQ(fresh->epoch(), 0);
  // And the intact bytes load.
  fresh->load_checkpoint_bytes(good, "good");
  EXPECT_EQ(all_state_bytes(*fresh), all_state_bytes(*t));
  EXPECT_EQ(fresh->epoch(), 1);
}

TEST_F(CheckpointTest, ConsistentChecksumsButWrongContentsAreErrors) {
  auto t = small_trainer();
  std::string path = ::testing::TempDir() + "/qg_content.qgck";
  t->save_checkpoint(path);
  std::vector<nn::CheckpointSection> good = nn::read_checkpoint(path);
  std::remove(path.c_str());
  auto load = [&](std::vector<nn::CheckpointSection> s) {
    t->load_checkpoint_bytes(nn::encode_checkpoint(s), "crafted");
  };
  auto find = [&](std::vector<nn::CheckpointSection>& s, const std::string& name) {
    for (auto& x : s)
      if (x.name == name) return &x;
    ADD_FAILURE() << "no section " << name;
    return &s[0];
  };
  {
    auto s = good;
    s.erase(s.begin() + 5);
    expect_error([&] { load(s); }, {"crafted", "missing section"});
  }
  {
    auto s = good;
    find(s, "state/fc1.weight/value")->payload = nn::encode_tensor(Tensor::zeros({3}, DType::f32));
    expect_error([&] { load(s); }, {"state/fc1.weight/value", "f32[3]", "f32[4, 64]"});
  }
  {
    auto s = good;
    find(s, "rng")->payload = "not a state";
    expect_error([&] { load(s); }, {"rng", "malformed"});
  }
  {
    auto s = good;
    find(s, "meta")->payload = "config x\n";
    expect_error([&] { load(s); }, {"written for 'x'"});
  }
  {
    auto s = good;
    find(s, "history")->payload = "1 2 nonsense\n";
    expect_error([&] { load(s); }, {"malformed history"});
  }
  {
    auto s = good;
    s.push_back({"state/ghost/value", nn::encode_tensor(Tensor::zeros({1}, DType::f32))});
    expect_error([&] { load(s); }, {"sections", "needs"});
  }
  {
    auto s = good;
    s.push_back(s[0]);
    expect_error([&] { load(s); }, {"duplicate section 'meta'"});
  }
  {
    // Version 2 with the file checksum recomputed, so only the version check can object.
    std::string bytes = nn::encode_checkpoint(good);
    bytes[8] = 2;
    std::string body = bytes.substr(0, bytes.size() - 4);
    uint32_t crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
    for (int i = 0; i < 4; ++i) body.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
    expect_error([&] { t->load_checkpoint_bytes(body, "v2"); }, {"v2", "version 2"});
  }
  load(good);  // the untouched sections still load
}

}  // namespace
}  // namespace qg
