// A graph of parameters whose gradients are fed as inputs and the update nodes of an
// OptimizerConfig (train/optimizer.h): the adamw and clip_grad_norm tests step it with chosen
// gradients and rates.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "train/optimizer.h"

namespace qg::testing {

struct OptimizerGraph {
  Graph g;
  std::vector<ValueId> params, grads;
  std::vector<NodeId> steps;
  std::unique_ptr<Executor> ex;

  OptimizerGraph(const std::vector<Tensor>& init, const nn::OptimizerConfig& config,
                 Device device = Device::cpu()) {
    for (size_t k = 0; k < init.size(); ++k) {
      params.push_back(g.parameter("p" + std::to_string(k), init[k]));
      grads.push_back(g.input("g" + std::to_string(k), {init[k].dtype(), init[k].shape()}));
    }
    steps = nn::optimizer_nodes(config)(g, params, grads);
    ex = std::make_unique<Executor>(g, device);
  }
  // One update with gradients `gs` at rate `lr` (< 0: leave the rate variable as it is);
  // returns the total gradient norm (NaN without clipping).
  double step(const std::vector<Tensor>& gs, double lr = -1) {
    if (lr >= 0) nn::set_learning_rate(*ex, lr);
    Executor::Feeds feeds;
    for (size_t k = 0; k < gs.size(); ++k) feeds["g" + std::to_string(k)] = gs[k];
    const ValueId norm = nn::grad_norm_value(g);
    std::vector<ValueId> fetches;
    if (norm != kNoValue) fetches.push_back(norm);
    std::vector<Tensor> out = ex->run(feeds, fetches, steps);
    return norm != kNoValue ? out[0].to(Device::cpu()).to_doubles()[0] : std::nan("");
  }
  Tensor& param(size_t k) { return ex->parameter("p" + std::to_string(k)); }
  std::vector<double> values(size_t k) { return param(k).to(Device::cpu()).to_doubles(); }
  Tensor& state(size_t k, const std::string& name) { return ex->state(steps[k], name); }
};

// Deterministic test data: n values of a, b-scaled sines.
inline Tensor wave(const Shape& shape, double a, double b, DType dtype = DType::f32) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = b * std::sin(a * (i + 1));
  return Tensor::from_doubles(shape, v, dtype);
}

}  // namespace qg::testing
