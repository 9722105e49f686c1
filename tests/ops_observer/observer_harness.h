// A one-observer graph (input x -> observer node) with its executor, for the observer tests:
// feed batches, read outputs and states, flip training mode and the enabled flag.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "tests/core/test_util.h"

namespace qg::testing {

class ObserverHarness {
 public:
  ObserverHarness(const std::string& op, const Shape& shape, const Attrs& attrs = {},
                  DType dtype = DType::f32)
      : shape_(shape), dtype_(dtype) {
    ValueId x = graph_.input("x", {dtype, shape});
    outputs_ = graph_.apply(op, {x}, attrs);
    node_ = graph_.value(outputs_[0]).producer;
    exec_ = std::make_unique<Executor>(graph_);
  }

  // Runs one batch; returns every output as doubles (scale, zero_point[, range_min, max]).
  std::vector<std::vector<double>> run(const std::vector<double>& x, bool training = true) {
    exec_->set_training(training);
    std::vector<Tensor> r = exec_->run({{"x", Tensor::from_doubles(shape_, x, dtype_)}}, outputs_);
    std::vector<std::vector<double>> out;
    for (const Tensor& t : r) out.push_back(t.to_doubles());
    return out;
  }

  std::vector<double> state(const std::string& name) {
    return exec_->state(node_, name).to_doubles();
  }
  void set_enabled(bool on) { exec_->state(node_, "observer_enabled").fill(on ? 1 : 0); }

 private:
  Graph graph_;
  Shape shape_;
  DType dtype_;
  std::vector<ValueId> outputs_;
  NodeId node_ = -1;
  std::unique_ptr<Executor> exec_;
};

// Building the node must fail with a qg::Error naming the op and every fragment.
inline void expect_build_error(const std::string& op, const Shape& shape, const Attrs& attrs,
                               const std::vector<std::string>& fragments,
                               DType dtype = DType::f32) {
  std::vector<std::string> all = fragments;
  all.push_back(op);
  expect_error(
      [&] {
        Graph g;
        ValueId x = g.input("x", {dtype, shape});
        g.apply(op, {x}, attrs);
      },
      all);
}

}  // namespace qg::testing
