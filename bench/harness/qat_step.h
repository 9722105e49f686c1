// A small QAT training step as one graph, for the memory planner report (`qat memplan`) and
// the CUDA-graph tests: a two-layer MLP with fake-quantized weights (min/max observer) and
// activations (moving-average observer + fake_quantize, the chain the fusion pass fuses),
// softmax cross-entropy, the backward graph, and one SGD step per parameter. Header-only so
// tests (which link only the library) can use it too.
#pragma once

#include <string>
#include <vector>

#include "autograd/grad.h"
#include "core/graph.h"

namespace qg::bench {

struct QatStep {
  ValueId loss = kNoValue;
  std::vector<ValueId> params;    // w1, b1, w2, b2
  std::vector<ValueId> grads;     // one per parameter
  std::vector<NodeId> sgd_steps;  // run as targets
  std::vector<NodeId> observers;  // nodes with observer state
  std::vector<std::string> input_names = {"x", "labels"};
};

// x: f32[batch, in], labels: i64[batch]. Parameters are seeded deterministically.
inline QatStep build_qat_step(Graph& g, int64_t batch, int64_t in, int64_t hidden, int64_t classes,
                              double lr = 0.05) {
  auto init = [](const Shape& s, double scale, int salt) {
    std::vector<double> v(static_cast<size_t>(shape_numel(s)));
    for (size_t i = 0; i < v.size(); ++i) {
      // A fixed, irregular pattern in [-scale, scale): no RNG, same on every machine.
      double u = static_cast<double>((i * 7919 + static_cast<size_t>(salt) * 104729) % 1000);
      v[i] = scale * (u / 500.0 - 1.0);
    }
    return Tensor::from_doubles(s, v);
  };
  QatStep st;
  ValueId x = g.input("x", {DType::f32, {batch, in}});
  ValueId labels = g.input("labels", {DType::i64, {batch}});
  ValueId w1 = g.parameter("w1", init({in, hidden}, 0.2, 1));
  ValueId b1 = g.parameter("b1", init({hidden}, 0.05, 2));
  ValueId w2 = g.parameter("w2", init({hidden, classes}, 0.2, 3));
  ValueId b2 = g.parameter("b2", init({classes}, 0.05, 4));
  st.params = {w1, b1, w2, b2};

  auto quantize_weight = [&](ValueId w, const std::string& name) {
    auto qp = g.apply("minmax_observer", {w}, {}, name + ".observer");
    st.observers.push_back(g.num_nodes() - 1);
    return g.apply("fake_quantize", {w, qp[0], qp[1]}, {}, name + ".fq")[0];
  };
  auto quantize_activation = [&](ValueId a, const std::string& name) {
    auto qp = g.apply("moving_average_observer", {a}, {}, name + ".observer");
    st.observers.push_back(g.num_nodes() - 1);
    return g.apply("fake_quantize", {a, qp[0], qp[1]}, {}, name + ".fq")[0];
  };

  ValueId xq = quantize_activation(x, "x");
  ValueId h = g.apply1("matmul", {xq, quantize_weight(w1, "w1")});
  h = g.apply1("relu", {g.apply1("add", {h, b1})});
  ValueId hq = quantize_activation(h, "h");
  ValueId logits = g.apply1("add", {g.apply1("matmul", {hq, quantize_weight(w2, "w2")}), b2});
  st.loss = g.apply1("softmax_cross_entropy", {logits, labels}, {}, "loss");
  g.set_name(st.loss, "loss");
  st.grads = grad(g, st.loss, st.params);
  for (size_t i = 0; i < st.params.size(); ++i) {
    std::vector<NodeId> readers = g.consumers(st.params[i]);
    g.apply("sgd", {st.params[i], st.grads[i]}, {{"lr", lr}, {"momentum", 0.9}},
            g.value(st.params[i]).name + ".sgd");
    NodeId step = g.num_nodes() - 1;  // sgd has no outputs: the newest vertex
    for (NodeId r : readers) g.add_control_dependency(r, step);
    st.sgd_steps.push_back(step);
  }
  return st;
}

// Labels in [0, classes) and inputs in [-1, 1), deterministic for a step index.
inline Tensor qat_step_x(int64_t batch, int64_t in, int step) {
  std::vector<double> v(static_cast<size_t>(batch * in));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((i * 31 + static_cast<size_t>(step) * 977) % 200) / 100.0 - 1.0;
  return Tensor::from_doubles({batch, in}, v);
}

inline Tensor qat_step_labels(int64_t batch, int64_t classes, int step) {
  std::vector<double> v(static_cast<size_t>(batch));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((i * 3 + static_cast<size_t>(step)) % static_cast<size_t>(classes));
  return Tensor::from_doubles({batch}, v, DType::i64);
}

}  // namespace qg::bench
