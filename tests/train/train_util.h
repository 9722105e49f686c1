// A small, fast training setup on the real digits data, shared by the train tests.
#pragma once

#include "train/trainer.h"

namespace qg::testing {

struct DigitsFixture {
  nn::Dataset train, test;
  DigitsFixture() {
    nn::Dataset all = nn::load_digits();
    nn::split_dataset(all, 0.2, 0, &train, &test);
  }
  static nn::TrainConfig config(nn::QConfig qc, int width = 16, uint64_t seed = 3) {
    nn::TrainConfig c;
    c.mlp.hidden = {width};
    c.mlp.batch = 64;
    c.qconfig = qc;
    c.optimizer.lr = 3e-3;
    c.seed = seed;
    return c;
  }
};

// Every node state of a trainer, in node order, as raw bytes.
inline std::vector<std::string> all_state_bytes(nn::Trainer& t) {
  std::vector<std::string> out;
  for (NodeId id = 0; id < t.graph().num_nodes(); ++id) {
    const Node& n = t.graph().node(id);
    if (n.states.empty() || n.op->name == "constant") continue;
    for (const Tensor& s : t.executor().states(id)) {
      Tensor c = s.to(Device::cpu());
      out.emplace_back(static_cast<const char*>(c.raw_data()), c.nbytes());
    }
  }
  return out;
}

}  // namespace qg::testing
