// The CNN and transformer models and their layers: each trains a few steps (loss falls),
// converts to integer weights with the fake-quant graph's accuracy, and the folded conv-bn
// block computes what an unfused reference computed here gives. These need the conv, norm,
// pooling and attention ops; a build without them skips (GTEST_SKIP naming the op).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/op_registry.h"
#include "nn/convert.h"
#include "nn/rng.h"
#include "tests/nn/nn_util.h"

namespace qg {
namespace {

using testing::digits;
using testing::small_config;

std::string missing_op(const std::vector<std::string>& ops) {
  for (const auto& op : ops)
    if (OpRegistry::instance().find(op) == nullptr) return op;
  return "";
}
#define REQUIRE_OPS(...)                                                      \
  do {                                                                        \
    std::string m = missing_op({__VA_ARGS__});                                \
    if (!m.empty()) GTEST_SKIP() << "this build has no op '" << m << "' yet"; \
  } while (0)
#define REQUIRE_CNN_OPS() REQUIRE_OPS("conv2d", "batch_norm", "max_pool2d", "global_avg_pool2d")
#define REQUIRE_TRANSFORMER_OPS() \
  REQUIRE_OPS("layer_norm", "batched_matmul", "softmax", "permute", "gelu", "embedding")

// Trains `epochs` epochs and checks the loss falls and conversion keeps the accuracy.
void train_and_convert(const std::string& kind, const nn::QConfig& qc, int epochs, double max_gap) {
  SCOPED_TRACE(kind + " " + qc.str());
  const auto& d = digits();
  nn::Trainer t(small_config(kind, qc), d.train, d.test);
  for (int e = 0; e < epochs; ++e) t.train_epoch();
  const auto& h = t.history();
  EXPECT_LT(h.back().train_loss, h.front().train_loss);
  const double fq = t.evaluate(d.test);
  EXPECT_GT(fq, 0.3);
  int64_t bytes = 0;
  const double ia = t.integer_accuracy(d.test, &bytes);
  EXPECT_LE(std::fabs(ia - fq), max_gap) << "fake-quant " << fq << ", integer " << ia;
  EXPECT_GT(bytes, 0);
}

// One test sample of 359/360 rows: folding batch norm into a bias changes the float rounding
// (conv / sf - mean) * sf vs conv - mean * sf, which may flip one near-tie argmax.
constexpr double kOneSample = 1.0 / 359.0 + 1e-12;

TEST(CnnModel, TrainsAndConvertsForEveryWeightKind) {
  REQUIRE_CNN_OPS();
  train_and_convert("cnn", nn::QConfig::float32(), 3, kOneSample);
  for (nn::QConfig qc : {nn::QConfig::w8a8(), nn::QConfig::w4a8(), nn::QConfig::w4a8_group(8),
                         nn::QConfig::nf4a8(), nn::QConfig::w4a4()})
    train_and_convert("cnn", qc, 3, kOneSample);
}

TEST(TransformerModel, TrainsAndConvertsForEveryWeightKind) {
  REQUIRE_TRANSFORMER_OPS();
  train_and_convert("transformer", nn::QConfig::float32(), 2, 0.0);
  for (nn::QConfig qc : {nn::QConfig::w8a8(), nn::QConfig::w4a8(), nn::QConfig::nf4a8(),
                         nn::QConfig::int8_dyn_act_int4_weight(8)})
    train_and_convert("transformer", qc, 2, 0.0);
}

TEST(CnnModel, FreezingBatchNormStopsTheRunningStatistics) {
  REQUIRE_CNN_OPS();
  const auto& d = digits();
  nn::TrainConfig c = small_config("cnn", nn::QConfig::w8a8());
  c.freeze_bn_after = 3;
  nn::Trainer t(c, d.train, d.test);
  t.train_epoch();  // 40 steps: frozen after the third
  Tensor before = t.executor().parameter("conv1.bn.running_mean").clone();
  t.train_epoch();
  Tensor after = t.executor().parameter("conv1.bn.running_mean");
  for (int64_t i = 0; i < before.numel(); ++i)
    EXPECT_EQ(before.data<float>()[i], after.data<float>()[i]);
}

// conv_bn (ReLU, int8 per-channel weights, float activations) on one batch in training
// mode against the unfused math computed here in double.
TEST(ConvBn, FoldingMatchesAnUnfusedReference) {
  REQUIRE_OPS("conv2d", "batch_norm");
  const int64_t n = 2, ci = 3, co = 4, k = 3, hw = 5;
  nn::QConfig qc;
  qc.weight = nn::WeightQuant::int8;
  Graph g;
  nn::Builder b(g, qc, 7);
  ValueId x = g.input("x", {DType::f32, {n, ci, hw, hw}});
  ValueId y = b.conv_bn(x, ci, co, k, "cb", 1, 1, true);
  const nn::WeightQuantizer& wq = b.weight_quantizers().at(0);
  Executor ex(g);
  nn::Rng rng(11);
  auto fill = [&](const std::string& name, double lo, double hi) {
    Tensor& t = ex.parameter(name);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<float>()[i] = static_cast<float>(rng.uniform(lo, hi));
    return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  };
  std::vector<float> w = fill("cb.weight", -0.5, 0.5), gamma = fill("cb.bn.weight", 0.5, 1.5),
                     beta = fill("cb.bn.bias", -0.2, 0.2),
                     rm = fill("cb.bn.running_mean", -0.1, 0.1),
                     rv = fill("cb.bn.running_var", 0.5, 2.0);
  Tensor xt = Tensor::empty({n, ci, hw, hw}, DType::f32);
  for (int64_t i = 0; i < xt.numel(); ++i)
    xt.data<float>()[i] = static_cast<float>(rng.uniform(-1, 1));
  auto out = ex.run({{"x", xt}}, {y, g.node(wq.observer).outputs[0]});
  const float* py = out[0].data<float>();
  const float* scale = out[1].data<float>();
  const double eps = 1e-5;
  // Folded, fake-quantized weight.
  std::vector<double> sf(co), wfq(w.size());
  const int64_t per = ci * k * k;
  for (int64_t o = 0; o < co; ++o) {
    sf[o] = static_cast<float>(gamma[o] / std::sqrt(rv[o] + static_cast<float>(eps)));
    double amax = 0;
    for (int64_t i = 0; i < per; ++i) amax = std::max(amax, std::fabs(w[o * per + i] * sf[o]));
    EXPECT_NEAR(scale[o], amax / 127.5, 1e-6 * amax) << "symmetric int8 scale, channel " << o;
    for (int64_t i = 0; i < per; ++i) {
      double v = static_cast<float>(w[o * per + i] * static_cast<float>(sf[o]));
      double q = std::min(127.0, std::max(-128.0, std::nearbyint(v / scale[o])));
      wfq[o * per + i] = q * scale[o];
    }
  }
  // conv (padding 1), divide by sf, batch statistics, gamma/beta, ReLU.
  std::vector<double> c(n * co * hw * hw, 0.0);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t o = 0; o < co; ++o)
      for (int64_t yy = 0; yy < hw; ++yy)
        for (int64_t xx = 0; xx < hw; ++xx) {
          double acc = 0;
          for (int64_t ic = 0; ic < ci; ++ic)
            for (int64_t dy = 0; dy < k; ++dy)
              for (int64_t dx = 0; dx < k; ++dx) {
                int64_t iy = yy + dy - 1, ix = xx + dx - 1;
                if (iy < 0 || ix < 0 || iy >= hw || ix >= hw) continue;
                acc += wfq[((o * ci + ic) * k + dy) * k + dx] *
                       xt.data<float>()[((s * ci + ic) * hw + iy) * hw + ix];
              }
          c[((s * co + o) * hw + yy) * hw + xx] = acc / sf[o];
        }
  const int64_t m = n * hw * hw;
  for (int64_t o = 0; o < co; ++o) {
    double mean = 0, var = 0;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t p = 0; p < hw * hw; ++p) mean += c[(s * co + o) * hw * hw + p];
    mean /= m;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t p = 0; p < hw * hw; ++p) {
        double dlt = c[(s * co + o) * hw * hw + p] - mean;
        var += dlt * dlt;
      }
    var /= m;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t p = 0; p < hw * hw; ++p) {
        int64_t i = (s * co + o) * hw * hw + p;
        double ref = std::max(0.0, (c[i] - mean) / std::sqrt(var + eps) * gamma[o] + beta[o]);
        EXPECT_NEAR(py[i], ref, 1e-4) << "channel " << o << " element " << p;
      }
    // Running statistics: momentum 0.1, unbiased variance.
    EXPECT_NEAR(ex.parameter("cb.bn.running_mean").data<float>()[o], 0.9 * rm[o] + 0.1 * mean,
                1e-5);
    EXPECT_NEAR(ex.parameter("cb.bn.running_var").data<float>()[o],
                0.9 * rv[o] + 0.1 * var * m / (m - 1), 1e-5);
  }
}

}  // namespace
}  // namespace qg

namespace qg {
namespace {

// Checkpoints hold every node state by name, so any model kind resumes bit for bit.
TEST(TransformerModel, ResumeFromACheckpointReplaysTheRun) {
  REQUIRE_TRANSFORMER_OPS();
  const auto& d = digits();
  nn::TrainConfig c = small_config("transformer", nn::QConfig::int8_dyn_act_int4_weight(8));
  nn::Trainer a(c, d.train, d.test);
  a.train_epoch();
  const std::string path = ::testing::TempDir() + "nn_transformer.qgck";
  a.save_checkpoint(path);
  a.train_epoch();
  nn::Trainer b(c, d.train, d.test);
  b.load_checkpoint(path);
  b.train_epoch();
  EXPECT_EQ(a.history().back().train_loss, b.history().back().train_loss);
  EXPECT_EQ(a.history().back().test_accuracy, b.history().back().test_accuracy);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace qg
