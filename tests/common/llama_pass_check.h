// The check every fusion pass of the language model's step passes: the tiny bf16-mixed Llama
// (tests/nn/tiny_llama_util.h) trained three optimizer steps with the pass and without it
// gives the same losses and the same states (parameters, moments, step counts), bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/llama.h"
#include "nn/qconfig.h"
#include "runtime/compile.h"
#include "tests/common/tensor_compare.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg::testing {

// Runs the comparison for `pass` on `device` (`recipe`: "float" or a QAT recipe); returns how many
// rewrites the pass made in the step with it on.
inline int expect_pass_keeps_llama_training(const std::string& pass, Device device,
                                            const std::string& recipe = "float",
                                            const nn::OptimizerConfig& optimizer = {"adam", 1e-2}) {
  auto run = [&](bool fuse, int* rewrites) {
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, tiny_llama_config(), 2, 7, nn::parse_recipe(recipe, 32),
                                       5, nn::parse_precision("bf16-mixed"));
    CompileOptions options;
    options.device = device;
    if (!fuse) options.passes.disabled.insert(pass);
    CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes(optimizer), {}}, options);
    std::vector<Tensor> out;
    for (int s = 0; s < 3; ++s)
      out.push_back(step.train(tiny_llama_feeds(), {m.loss})[0].to(Device::cpu()));
    step.synchronize();
    for (const PassRecord& r : step.passes())
      if (r.name == pass) *rewrites = r.rewrites;
    for (const auto& [key, t] : state_index(step.executor())) out.push_back(t->to(Device::cpu()));
    return out;
  };
  int fused_rewrites = -1, plain_rewrites = -1;
  const std::vector<Tensor> fused = run(true, &fused_rewrites), plain = run(false, &plain_rewrites);
  EXPECT_EQ(plain_rewrites, 0) << pass;
  EXPECT_EQ(fused.size(), plain.size()) << pass;
  for (size_t i = 0; i < fused.size() && i < plain.size(); ++i)
    EXPECT_EQ(first_difference(fused[i], plain[i]), "") << pass << ", output " << i;
  return fused_rewrites;
}

}  // namespace qg::testing
