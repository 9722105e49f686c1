// Evaluation of a last partial batch without padding (every sample counts once), and the
// layer library's bad-input errors.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/convert.h"
#include "tests/nn/nn_util.h"

namespace qg {
namespace {

using testing::digits;
using testing::expect_error;
using testing::head_rows;
using testing::small_config;

TEST(PartialBatch, EverySampleCountsOnceWithoutPadding) {
  const auto& d = digits();
  nn::Trainer t(small_config("mlp", nn::QConfig::w8a8()), d.train, d.test);  // batch 32
  t.train_epoch();
  // 70 rows: two full batches and a remainder of 6 on the second instance.
  nn::Dataset seventy = head_rows(d.test, 70);
  std::vector<float> logits = t.predict(seventy);
  ASSERT_EQ(logits.size(), 70u * 10u);
  // The same rows inside full batches (rows 6..69: two batches of 32) give the same logits.
  nn::Dataset shifted = head_rows(d.test, 64, 6);
  std::vector<float> ref = t.predict(shifted);
  for (int64_t r = 64; r < 70; ++r)
    for (int64_t c = 0; c < 10; ++c)
      EXPECT_NEAR(logits[r * 10 + c], ref[(r - 6) * 10 + c], 1e-5f) << "row " << r;
  // Accuracy counts each of the 70 rows once.
  int64_t correct = 0;
  for (int64_t r = 0; r < 70; ++r) {
    int64_t best = 0;
    for (int64_t c = 1; c < 10; ++c) best = logits[r * 10 + c] > logits[r * 10 + best] ? c : best;
    correct += best == seventy.labels[r] ? 1 : 0;
  }
  EXPECT_DOUBLE_EQ(t.evaluate(seventy), static_cast<double>(correct) / 70.0);
  // A set smaller than one batch runs on the remainder instance alone.
  nn::Dataset five = head_rows(d.test, 5, 65);
  std::vector<float> small = t.predict(five);
  ASSERT_EQ(small.size(), 50u);
  for (int64_t i = 0; i < 50; ++i) EXPECT_NEAR(small[i], logits[65 * 10 + i], 1e-5f);
  // Integer-weight evaluation covers the same rows.
  int64_t bytes = 0;
  double ia = t.integer_accuracy(seventy, &bytes);
  EXPECT_DOUBLE_EQ(ia, t.evaluate(seventy));
}

TEST(LayerErrors, AttentionHeadsMustDivideTheWidth) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId x = g.input("x", {DType::f32, {2, 8, 30}});
  expect_error([&] { b.attention(x, 4, "block0.attn"); },
               {"nn.attention", "block0.attn", "heads = 4", "D = 30"});
}

TEST(LayerErrors, SequenceLongerThanThePositionalTable) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId x = g.input("x", {DType::f32, {2, 16, 8}});
  expect_error([&] { b.token_embedding(x, 32, 8, "embed"); },
               {"nn.embedding", "embed", "sequence length 16", "8 rows"});
}

TEST(LayerErrors, ConvChannelMismatchBetweenLayers) {
  Graph g;
  nn::Builder b(g, nn::QConfig::w8a8(), 1);
  ValueId x = g.input("x", {DType::f32, {2, 3, 8, 8}});
  expect_error([&] { b.conv_bn(x, 4, 8, 3, "conv2", 1, 1); },
               {"nn.conv_bn", "conv2", "expects 4 input channels", "has 3"});
  expect_error([&] { b.conv2d(x, 16, 8, 3, "conv3"); },
               {"nn.conv2d", "conv3", "expects 16 input channels", "has 3"});
}

TEST(LayerErrors, UnknownModelKind) {
  const auto& d = digits();
  nn::TrainConfig c = small_config("resnet", nn::QConfig::float32());
  expect_error([&] { nn::Trainer t(c, d.train, d.test); },
               {"nn.model", "unknown model kind 'resnet'", "mlp, cnn, transformer"});
}

TEST(LayerErrors, LinearNeedsAMatrixInput) {
  Graph g;
  nn::Builder b(g, nn::QConfig::float32(), 1);
  ValueId x = g.input("x", {DType::f32, {5}});
  expect_error([&] { b.linear(x, 3, "fc", false, false); }, {"nn.linear", "fc", "rank >= 2"});
}

}  // namespace
}  // namespace qg
