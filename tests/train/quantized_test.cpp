// Conversion to real integer weights: codes reproduce the fake-quant weights exactly,
// INT4/NF4 packing, model sizes, and integer-weight accuracy matching the fake-quant graph.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>

#include "autograd/grad.h"
#include "nn/quantized.h"
#include "tests/core/test_util.h"
#include "tests/train/train_util.h"
#include "train/evaluate.h"
#include "train/png_plot.h"

namespace qg {
namespace {

using testing::DigitsFixture;

class QuantizedTest : public ::testing::Test, public DigitsFixture {};

// The weight the fake-quant graph used (the fake_quantize node's output on fc1's weight),
// read from an unfused instance of the model holding the trainer's states: the trainer's
// own graph is compiled, and its weight fake-quant is fused with its observer.
std::vector<double> fake_quant_weight(nn::Trainer& t, const std::string& layer) {
  nn::ModelInstance inst = nn::build_instance(t.config().spec(), t.config().mlp.batch,
                                              t.config().qconfig, Device::cpu());
  nn::copy_states(t.executor(), *inst.exec);
  ValueId fq = kNoValue;
  for (NodeId id = 0; id < inst.graph->num_nodes(); ++id)
    if (inst.graph->node(id).name == layer + ".weight.fq") fq = inst.graph->node(id).outputs[0];
  EXPECT_NE(fq, kNoValue);
  Executor::Feeds feeds;
  for (ValueId in : inst.graph->inputs()) {
    const Value& v = inst.graph->value(in);
    feeds[v.name] = Tensor::zeros(v.type.shape, v.type.dtype);  // eval mode: not observed
  }
  return inst.exec->run(feeds, {fq})[0].to_doubles();
}

TEST_F(QuantizedTest, Int8AndInt4CodesDequantizeToTheFakeQuantWeights) {
  for (nn::QConfig qc : {nn::QConfig::w8a8(), nn::QConfig::w4a8(), nn::QConfig::nf4a8()}) {
    nn::Trainer t(config(qc), train, test);
    t.train_epoch();
    nn::QuantizedMlp q =
        nn::convert_to_quantized(t.executor(), t.model().layers, t.model().input_observer, qc);
    const nn::QuantizedLinear& l = q.layers[0];
    std::vector<double> want = fake_quant_weight(t, "fc1");
    ASSERT_EQ(static_cast<int64_t>(want.size()), l.in * l.out);
    for (int64_t r = 0; r < l.out; ++r)
      for (int64_t c = 0; c < l.in; ++c) {
        int code;
        if (qc.weight == nn::WeightQuant::nf4) {
          // One absmax group per row here (64 inputs, group 64): the graph's
          // nf4_unpack_dequantize output must equal table[code] * absmax exactly.
          uint8_t b = l.packed[r * ((l.in + 1) / 2) + c / 2];
          ASSERT_EQ(nn::nf4_value((c % 2 == 0) ? (b & 0xf) : (b >> 4)) * l.scales[r],
                    static_cast<float>(want[r * l.in + c]))
              << "nf4 row " << r << " col " << c;
          continue;
        }
        if (qc.weight == nn::WeightQuant::int8) {
          code = l.codes8[r * l.in + c];
        } else {
          uint8_t b = l.packed[r * ((l.in + 1) / 2) + c / 2];
          code = ((c % 2 == 0) ? (b & 0xf) : (b >> 4)) - 8;
          ASSERT_TRUE(code >= -8 && code <= 7);
        }
        ASSERT_EQ(static_cast<float>(code) * l.scales[r], static_cast<float>(want[r * l.in + c]))
            << qc.str() << " row " << r << " col " << c;
      }
    // Bytes: 3 activation quantizers (input, fc1 out, fc2 out) x 8; per layer the codes,
    // one f32 scale per output channel and the f32 bias. int8: fc1 1024 + 64 + 64, fc2
    // 160 + 40 + 40. int4 packs two codes per byte: fc1 512 + 64 + 64, fc2 80 + 40 + 40.
    // NF4 stores one f32 absmax per 64-weight group along a row: one per row here, so its
    // size equals INT4's.
    int64_t expect = qc.weight == nn::WeightQuant::int8 ? 24 + 1152 + 240 : 24 + 640 + 160;
    EXPECT_EQ(q.size_bytes(), expect) << qc.str();
  }
}

TEST_F(QuantizedTest, IntegerWeightAccuracyMatchesTheFakeQuantGraph) {
  nn::Trainer t(config(nn::QConfig::w8a8(), 32), train, test);
  for (int e = 0; e < 3; ++e) t.train_epoch();
  double fq = t.evaluate(test);
  nn::QuantizedMlp q = nn::convert_to_quantized(t.executor(), t.model().layers,
                                                t.model().input_observer, t.config().qconfig);
  // Only float summation order differs (Eigen's blocked matmul vs a row loop), which can
  // move an activation across a rounding boundary: allow one test sample of difference.
  EXPECT_NEAR(nn::accuracy_of(q, test), fq, 1.0 / test.size() + 1e-12);
  // And the logits agree closely.
  std::vector<float> a = t.predict(test), b = q.forward(test.x.data(), test.size());
  ASSERT_EQ(a.size(), b.size());
  int far = 0;
  for (size_t i = 0; i < a.size(); ++i) far += std::fabs(a[i] - b[i]) > 0.2f ? 1 : 0;
  EXPECT_LE(far, static_cast<int>(a.size() / 100));
}

TEST(Nf4, StraightThroughWeightIsExactForwardAndIdentityBackward) {
  Graph g;
  nn::Builder b(g, nn::QConfig::nf4a8(), 1);
  std::vector<double> wv(2 * 64);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = std::sin(0.7 * static_cast<double>(i));
  ValueId w = g.parameter("w", Tensor::from_doubles({2, 64}, wv));
  ValueId wq = b.weight(w, "w");
  ValueId x = g.input("x", {DType::f32, {2, 64}});
  ValueId loss = g.apply1("sum", {g.apply1("mul", {wq, x})});
  ValueId dw = grad(g, loss, {w})[0];
  Executor ex(g);
  std::vector<double> xv(128);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.5 + static_cast<double>(i);
  auto out = ex.run({{"x", Tensor::from_doubles({2, 64}, xv)}}, {wq, dw});
  std::vector<double> q = out[0].to_doubles(), d = out[1].to_doubles();
  for (int r = 0; r < 2; ++r) {
    double absmax = 0;
    for (int c = 0; c < 64; ++c)
      absmax = std::max(absmax, std::fabs(static_cast<double>(static_cast<float>(wv[r * 64 + c]))));
    for (int c = 0; c < 64; ++c) {
      float v = static_cast<float>(wv[r * 64 + c]) * (1.0f / static_cast<float>(absmax));
      EXPECT_EQ(q[r * 64 + c], nn::nf4_value(nn::nf4_code(v)) * static_cast<float>(absmax));
    }
  }
  EXPECT_EQ(d, xv);  // straight through: d(sum(wq * x))/dw = x
}

TEST(Nf4, CodesFollowTheMidpointRule) {
  EXPECT_EQ(nn::nf4_code(-1.0f), 0);
  EXPECT_EQ(nn::nf4_code(1.0f), 15);
  EXPECT_EQ(nn::nf4_code(0.0f), 7);
  EXPECT_EQ(nn::nf4_code(std::nanf("")), 7);
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(nn::nf4_code(nn::nf4_value(c)), c);
  // A tie at the midpoint goes to the lower code.
  float mid = (nn::nf4_value(7) + nn::nf4_value(8)) * 0.5f;
  EXPECT_EQ(nn::nf4_code(mid), 7);
  EXPECT_EQ(nn::nf4_code(std::nextafter(mid, 1.0f)), 8);
}

TEST(Png, EncodesAValidImage) {
  std::vector<uint8_t> rgb(4 * 3 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7);
  std::string png = nn::encode_png(4, 3, rgb);
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  // IDAT holds zlib data that inflates to rows of (filter 0, RGB bytes).
  size_t idat = png.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len = (len << 8) | static_cast<unsigned char>(png[idat - 4 + i]);
  std::string raw(3 * (1 + 4 * 3), '\0');
  uLongf raw_len = raw.size();
  ASSERT_EQ(uncompress(reinterpret_cast<Bytef*>(&raw[0]), &raw_len,
                       reinterpret_cast<const Bytef*>(png.data() + idat + 4), len),
            Z_OK);
  for (int y = 0; y < 3; ++y) {
    EXPECT_EQ(raw[y * 13], 0);
    for (int k = 0; k < 12; ++k)
      EXPECT_EQ(static_cast<uint8_t>(raw[y * 13 + 1 + k]), rgb[y * 12 + k]);
  }
  // Every chunk's CRC covers its type and data.
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i)
    stored = (stored << 8) | static_cast<unsigned char>(png[idat + 4 + len + i]);
  EXPECT_EQ(stored, crc32(0, reinterpret_cast<const Bytef*>(png.data() + idat), len + 4));
  testing::expect_error([] { nn::encode_png(2, 2, std::vector<uint8_t>(5)); }, {"png", "needs 12"});
}

}  // namespace
}  // namespace qg
