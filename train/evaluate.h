// Scoring a trained digits model on a dataset: the logits of a model's forward graph, the
// accuracy of logits, of the converted integer model (nn/convert.h) and of the plain-C++
// QuantizedMlp (nn/quantized.h). Kept apart from the models so that nn/ needs no dataset.
#pragma once

#include <cstdint>
#include <vector>

#include "data/digits.h"
#include "nn/convert.h"
#include "nn/model.h"
#include "nn/quantized.h"
#include "runtime/executor.h"

namespace qg::nn {

// Logits [rows, classes] of data rows [start, start + rows) through a graph whose batch is
// `rows` (eval mode; training mode is restored).
std::vector<float> run_logits(Executor& ex, const Model& m, const Dataset& data, int64_t start);

// Converts a trained model (its executor `trained`) at batch data.size() and returns its
// accuracy on `data`; `bytes` receives the model size.
double integer_accuracy(Executor& trained, const ModelSpec& spec, const QConfig& qconfig,
                        const Dataset& data, int64_t* bytes);

// The fraction of rows whose largest logit is the label (0 for an empty dataset).
double accuracy_of(const std::vector<float>& logits, const Dataset& data, int64_t classes);
// The integer MLP's accuracy on `data`.
double accuracy_of(const QuantizedMlp& mlp, const Dataset& data);

}  // namespace qg::nn
