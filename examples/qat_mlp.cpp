// Builds, trains and evaluates a quantization-aware MLP on the UCI digits data, using the
// nn/ API directly: a graph with int8 per-channel weight fake-quant and uint8 activation
// fake-quant, Adam as graph nodes, then a conversion to real int8 weights.
#include <cstdio>

#include "data/digits.h"
#include "nn/model.h"
#include "nn/quantized.h"
#include "runtime/compile.h"
#include "train/evaluate.h"
#include "train/optimizer.h"

using namespace qg;

int main() try {
  // 1. Data: 80/20 seeded split, pixels scaled to [0, 1].
  nn::Dataset all = nn::load_digits(), train, test;
  nn::split_dataset(all, 0.2, /*seed=*/0, &train, &test);

  // 2. Model: 64 -> 128 -> ReLU -> 10 with W8A8 fake quantization, loss, Adam.
  const int64_t batch = 64;
  Graph g;
  nn::Builder b(g, nn::QConfig::w8a8(), /*seed=*/1);
  ValueId x = g.input("x", {DType::f32, {batch, 64}});
  ValueId labels = g.input("labels", {DType::i64, {batch}});
  ValueId h = b.linear(b.quant_input(x), 128, "fc1", /*relu=*/true, /*quantize_output=*/true);
  ValueId logits = b.linear(h, 10, "fc2", /*relu=*/false, /*quantize_output=*/true);
  ValueId loss = b.cross_entropy(logits, labels);

  // 3. Compile: gradients, Adam's update nodes, the fusion passes and the memory plan (and a
  //    captured CUDA graph on a GPU). Each train() does forward, backward and the updates.
  CompileOptions options;
  options.outputs = {loss, logits};
  CompiledStep step(g, {loss, b.parameters(), nn::optimizer_nodes({"adam", 3e-3}), {}}, options);
  nn::Rng rng(7);
  Tensor xb = Tensor::empty({batch, 64}, DType::f32), yb = Tensor::empty({batch}, DType::i64);
  for (int epoch = 1; epoch <= 15; ++epoch) {
    std::vector<int64_t> order = rng.permutation(train.size());
    double total = 0;
    int64_t n = train.size() / batch;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t r = 0; r < batch; ++r) {
        int64_t i = order[s * batch + r];
        for (int64_t f = 0; f < 64; ++f) xb.data<float>()[r * 64 + f] = train.x[i * 64 + f];
        yb.data<int64_t>()[r] = train.labels[i];
      }
      total += step.train({{"x", xb}, {"labels", yb}}, {loss})[0].at(0);
    }
    std::printf("epoch %2d  loss %.4f\n", epoch, total / n);
  }

  // 4. Evaluate the fake-quant graph (eval mode freezes the observers) in padded batches.
  int64_t correct = 0;
  for (int64_t start = 0; start < test.size(); start += batch) {
    for (int64_t r = 0; r < batch; ++r) {
      int64_t i = std::min(start + r, test.size() - 1);  // pad with the last row
      for (int64_t f = 0; f < 64; ++f) xb.data<float>()[r * 64 + f] = test.x[i * 64 + f];
    }
    const Tensor& out = step.forward({{"x", xb}}, {logits}, /*training=*/false)[0];
    for (int64_t r = 0; r < batch && start + r < test.size(); ++r) {
      const float* row = out.data<float>() + r * 10;
      int64_t best = 0;
      for (int64_t c = 1; c < 10; ++c) best = row[c] > row[best] ? c : best;
      correct += best == test.labels[start + r] ? 1 : 0;
    }
  }
  std::printf("fake-quant test accuracy: %.2f%%\n", 100.0 * correct / test.size());

  // 5. Convert to real int8 weights and evaluate with dequantize-on-the-fly.
  nn::QuantizedMlp q = nn::convert_to_quantized(step.executor(), b);
  std::printf("int8 model: %lld bytes, test accuracy %.2f%%\n",
              static_cast<long long>(q.size_bytes()), 100.0 * nn::accuracy_of(q, test));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
