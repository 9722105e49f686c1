#include "train/evaluate.h"

#include <cstring>

#include "core/error.h"

namespace qg::nn {

std::vector<float> run_logits(Executor& ex, const Model& m, const Dataset& data, int64_t start) {
  const int64_t rows = m.batch, f = data.features;
  QG_CHECK(start >= 0 && start + rows <= data.size(), "evaluate", "rows [", start, ", ",
           start + rows, ") outside a dataset of ", data.size());
  Tensor x = Tensor::empty({rows, f}, DType::f32);
  std::memcpy(x.data<float>(), data.x.data() + start * f, sizeof(float) * rows * f);
  bool was = ex.training();
  ex.set_training(false);
  Tensor logits = ex.run({{"x", x.to(ex.device())}}, {m.logits})[0].to(Device::cpu());
  ex.set_training(was);
  return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
}

double accuracy_of(const std::vector<float>& logits, const Dataset& data, int64_t classes) {
  int64_t correct = 0;
  for (int64_t i = 0; i < data.size(); ++i) {
    const float* row = logits.data() + i * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) best = row[c] > row[best] ? c : best;
    correct += best == data.labels[i] ? 1 : 0;
  }
  return data.size() == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(data.size());
}

double accuracy_of(const QuantizedMlp& mlp, const Dataset& data) {
  return accuracy_of(mlp.forward(data.x.data(), data.size()), data, mlp.layers.back().out);
}

double integer_accuracy(Executor& trained, const ModelSpec& spec, const QConfig& qconfig,
                        const Dataset& data, int64_t* bytes) {
  ModelInstance inst = build_instance(spec, data.size(), qconfig, trained.device());
  copy_states(trained, *inst.exec);
  int64_t b = convert_to_integer(inst, qconfig);
  if (bytes != nullptr) *bytes = b;
  return accuracy_of(run_logits(*inst.exec, inst.model, data, 0), data, inst.model.classes);
}

}  // namespace qg::nn
