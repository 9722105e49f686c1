// The plain conv2d layer (no batch norm) with pooling: it trains on the digits images, and a
// hand-assembled ModelInstance of it converts to integer weights (4-D weights through the
// [out, in * k * k] quantizer view, int8 codes and packed INT4) with the fake-quant logits.
#include <gtest/gtest.h>

#include <cstring>

#include "core/op_registry.h"
#include "tests/nn/nn_util.h"
#include "train/evaluate.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::digits;

// x [batch, 64] -> [batch, 1, 8, 8] -> conv 1->4 (ReLU) -> max_pool 2 -> conv 4->8 (ReLU)
// -> global average pool -> linear 8->10.
nn::Model build_conv_net(Graph& g, const nn::QConfig& qc, int64_t batch) {
  nn::Builder b(g, qc, 5);
  nn::Model m;
  m.batch = batch;
  m.classes = 10;
  m.x = g.input("x", {DType::f32, {batch, 64}});
  m.labels = g.input("labels", {DType::i64, {batch}});
  ValueId h = g.apply1("reshape", {b.quant_input(m.x)}, {{"shape", Shape{batch, 1, 8, 8}}});
  h = b.conv2d(h, 1, 4, 3, "conv1", 1, 1, true);
  h = b.max_pool2d(h, 2, "pool");
  h = b.conv2d(h, 4, 8, 3, "conv2", 1, 1, true);
  h = b.global_avg_pool(h, "gap");
  m.logits = b.linear(h, 10, "fc", false, qc.static_activations());
  m.loss = b.cross_entropy(m.logits, m.labels);
  m.weights = b.weight_quantizers();
  m.parameters = b.parameters();
  return m;
}

TEST(Conv2dLayer, TrainsAndConvertsToTheFakeQuantLogits) {
  for (const char* op : {"conv2d", "max_pool2d", "global_avg_pool2d"})
    if (OpRegistry::instance().find(op) == nullptr) GTEST_SKIP() << "no op '" << op << "'";
  const auto& d = digits();
  for (nn::QConfig qc : {nn::QConfig::w8a8(), nn::QConfig::w4a8(), nn::QConfig::w4a8_group(8)}) {
    SCOPED_TRACE(qc.str());
    const int64_t batch = 32;
    Graph g;
    nn::Model m = build_conv_net(g, qc, batch);
    std::vector<NodeId> steps = nn::add_optimizer(g, m.loss, m.parameters, {"adam", 1e-2});
    Executor ex(g);
    Tensor x = Tensor::empty({batch, 64}, DType::f32), y = Tensor::empty({batch}, DType::i64);
    double first = 0, last = 0;
    const int n_steps = 40;
    for (int s = 0; s < n_steps; ++s) {
      const int64_t start = (s * batch) % (d.train.size() - batch);
      std::memcpy(x.data<float>(), d.train.x.data() + start * 64, sizeof(float) * batch * 64);
      std::memcpy(y.data<int64_t>(), d.train.labels.data() + start, sizeof(int64_t) * batch);
      double loss = ex.run({{"x", x}, {"labels", y}}, {m.loss}, steps)[0].at(0);
      if (s < 5) first += loss / 5;
      if (s >= n_steps - 5) last += loss / 5;
    }
    EXPECT_LT(last, first);
    // Fake-quant logits of the first test rows, then the converted instance's.
    std::vector<float> fq = nn::run_logits(ex, m, d.test, 0);
    nn::ModelInstance inst;
    inst.graph = std::make_unique<Graph>();
    inst.model = build_conv_net(*inst.graph, qc, batch);
    inst.exec = std::make_unique<Executor>(*inst.graph);
    nn::copy_states(ex, *inst.exec);
    const int64_t bytes = nn::convert_to_integer(inst, qc);
    EXPECT_GT(bytes, 0);
    std::vector<float> ia = nn::run_logits(*inst.exec, inst.model, d.test, 0);
    ASSERT_EQ(ia.size(), fq.size());
    for (size_t i = 0; i < fq.size(); ++i) EXPECT_EQ(ia[i], fq[i]) << "logit " << i;
  }
}

}  // namespace
}  // namespace qg
