// What a program outside this repository does with the installed package: every op family
// is registered (the registry is filled from the library's op table, not by static
// initialisers a linker could drop), then examples/qat_mlp.cpp in short: a W8A8 MLP on the
// digits data, trained, evaluated, converted to int8, and its parameters round-tripped
// through a safetensors file. Exits non-zero on any failure.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

// Headers by the package's name, as another library's are included; legacy_names.cpp checks
// the root-relative names ("runtime/executor.h") still resolve.
#include <qatgraph/autograd/grad.h>
#include <qatgraph/core/op_registry.h>
#include <qatgraph/core/safetensors.h>
#include <qatgraph/data/digits.h>
#include <qatgraph/nn/model.h>
#include <qatgraph/nn/quantized.h>
#include <qatgraph/runtime/executor.h>
#include <qatgraph/train/evaluate.h>
#include <qatgraph/train/optimizer.h>

bool legacy_header_names_resolve();

using namespace qg;

namespace {

int checks = 0, failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
  ++checks;
  failures += ok ? 0 : 1;
}

// One op of each family in ops/op_table.cpp.
void check_registry() {
  const char* one_per_family[] = {"input",
                                  "add",
                                  "matmul",
                                  "relu",
                                  "sum",
                                  "softmax_cross_entropy",
                                  "fake_quantize",
                                  "minmax_observer",
                                  "lsq_fake_quantize",
                                  "quantize",
                                  "dynamic_range_quantize",
                                  "int4_quantize_pack",
                                  "nf4_quantize_pack",
                                  "adam",
                                  "fused_observe_quantize",
                                  "batch_norm",
                                  "max_pool2d",
                                  "dropout",
                                  "softmax",
                                  "embedding",
                                  "transpose",
                                  "conv2d",
                                  "conv_bn_fold_weight",
                                  "cast",
                                  "all_reduce"};
  const OpRegistry& registry = OpRegistry::instance();
  int missing = 0;
  for (const char* op : one_per_family) {
    if (registry.find(op) == nullptr) {
      std::printf("op '%s' is not registered\n", op);
      ++missing;
    }
  }
  expect(missing == 0, "one op of each of the 25 families registered (" +
                           std::to_string(registry.all().size()) + " ops)");
#ifdef QG_WITH_CUDA
  expect(registry.supports("fake_quantize", DeviceType::cuda, {DType::f32}),
         "CUDA kernels registered (library built with CUDA)");
#endif
}

}  // namespace

int main() try {
  check_registry();
  expect(legacy_header_names_resolve(),
         "headers by their root-relative names (\"runtime/executor.h\")");

  nn::Dataset all = nn::load_digits(), train, test;
  nn::split_dataset(all, 0.2, /*seed=*/0, &train, &test);

  const int64_t batch = 64;
  Graph g;
  nn::Builder b(g, nn::QConfig::w8a8(), /*seed=*/1);
  ValueId x = g.input("x", {DType::f32, {batch, 64}});
  ValueId labels = g.input("labels", {DType::i64, {batch}});
  ValueId h = b.linear(b.quant_input(x), 64, "fc1", /*relu=*/true, /*quantize_output=*/true);
  ValueId logits = b.linear(h, 10, "fc2", /*relu=*/false, /*quantize_output=*/true);
  ValueId loss = b.cross_entropy(logits, labels);
  std::vector<NodeId> steps = nn::add_optimizer(g, loss, b.parameters(), {"adam", 3e-3});

  Executor ex(g);
  nn::Rng rng(7);
  Tensor xb = Tensor::empty({batch, 64}, DType::f32), yb = Tensor::empty({batch}, DType::i64);
  double first_loss = 0, last_loss = 0;
  for (int epoch = 1; epoch <= 4; ++epoch) {
    std::vector<int64_t> order = rng.permutation(train.size());
    double total = 0;
    int64_t n = train.size() / batch;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t r = 0; r < batch; ++r) {
        int64_t i = order[s * batch + r];
        for (int64_t f = 0; f < 64; ++f) xb.data<float>()[r * 64 + f] = train.x[i * 64 + f];
        yb.data<int64_t>()[r] = train.labels[i];
      }
      total += ex.run({{"x", xb}, {"labels", yb}}, {loss}, steps)[0].at(0);
    }
    (epoch == 1 ? first_loss : last_loss) = total / n;
  }
  std::printf("loss: epoch 1 %.4f, epoch 4 %.4f\n", first_loss, last_loss);
  // QAT loss falls more slowly than float loss at first (the moving-average activation
  // observers' ranges lag the weights); the accuracy check below is the real criterion.
  expect(last_loss < 0.8 * first_loss, "training lowers the loss by 20%");

  ex.set_training(false);
  nn::QuantizedMlp q = nn::convert_to_quantized(ex, b);
  double accuracy = nn::accuracy_of(q, test);
  std::printf("int8 model: %lld bytes, test accuracy %.2f%%\n",
              static_cast<long long>(q.size_bytes()), 100.0 * accuracy);
  expect(accuracy > 0.85, "int8 test accuracy above 85%");

  // Parameters out to safetensors and back.
  std::map<std::string, Tensor> params;
  for (NodeId p : g.parameters()) params[g.node(p).name] = ex.parameter(g.node(p).name);
  std::string path =
      (std::filesystem::temp_directory_path() / "qatgraph_consumer.safetensors").string();
  save_safetensors(path, params);
  std::map<std::string, Tensor> back = load_safetensors(path);
  std::filesystem::remove(path);
  bool same = back.size() == params.size();
  for (const auto& [name, t] : params)
    same = same && back.count(name) && back[name].to_doubles() == t.to_doubles();
  expect(same, "parameters round-trip through safetensors");

  std::printf("consumer: %d of %d checks failed\n", failures, checks);
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
