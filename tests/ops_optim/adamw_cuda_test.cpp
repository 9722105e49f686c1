// adamw and clip_grad_norm on CUDA against the CPU kernels (GPU machines only): several steps
// at changing rates, a compiled step whose CUDA graph replays across a rate schedule, and the
// non-finite norm recorded on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "device/device_context.h"
#include "runtime/compile.h"
#include "tests/core/test_util.h"
#include "tests/ops_optim/adamw_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::OptimizerGraph;
using testing::wave;

nn::OptimizerConfig clipped_adamw() {
  nn::OptimizerConfig c;
  c.kind = "adamw";
  c.lr = 0.01;
  c.weight_decay = 0.1;
  c.clip_grad_norm = 1.0;
  return c;
}

// Same f32 expressions on both sides; the bias corrections use the device's pow, which may
// differ from glibc's in the last bit before rounding (2 ulps, as the adam op's test). The
// norms are f64 sums in another order (blocks and trees vs element order), rounded to f32:
// equal unless a sum lands within an f64 rounding of an f32 tie (1 ulp).
void expect_close(const std::vector<double>& cpu, const std::vector<double>& gpu, double ulps,
                  const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    ASSERT_NEAR(cpu[i], gpu[i], ulps * 1.2e-7 * std::max(1.0, std::fabs(cpu[i])))
        << what << " element " << i;
}

TEST(AdamWCuda, MatchesTheCpuKernelsAcrossRates) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device in this build or machine";
  // Sizes across the norm kernel's slices and a gradient list longer than one launch's.
  std::vector<Shape> shapes = {{1000}, {37}, {300, 70}, {1}};
  for (int k = 0; k < 40; ++k) shapes.push_back({k + 2});
  std::vector<Tensor> init;
  for (size_t k = 0; k < shapes.size(); ++k) init.push_back(wave(shapes[k], 0.37 + 0.01 * k, 1.0));
  for (bool clip : {true, false}) {
    SCOPED_TRACE(clip ? "clipped" : "unclipped");
    nn::OptimizerConfig c = clipped_adamw();
    if (!clip) c.clip_grad_norm = 0.0;
    OptimizerGraph cpu(init, c), gpu(init, c, Device::cuda());
    const double rates[3] = {0.01, 0.0037, 0.02};
    for (int s = 0; s < 3; ++s) {
      std::vector<Tensor> g;
      for (size_t k = 0; k < shapes.size(); ++k)
        g.push_back(wave(shapes[k], 0.11 * (s + 1) + 0.003 * k, 0.5 * (s + 1)));
      const double nc = cpu.step(g, rates[s]), ng = gpu.step(g, rates[s]);
      if (clip) expect_close({nc}, {ng}, 1, "norm");
    }
    for (size_t k = 0; k < shapes.size(); ++k)
      expect_close(cpu.values(k), gpu.values(k), 2, "param " + std::to_string(k));
    EXPECT_EQ(gpu.state(0, "step").to(Device::cpu()).at(0), 3);
  }
}

TEST(AdamWCuda, CompiledStepReplaysTheScheduleWithoutRecompiling) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device in this build or machine";
  // loss = sum_k sum(p_k * x_k): the gradients are the fed x_k.
  auto run = [](Device d, std::vector<double>& norms) {
    Graph g;
    std::vector<ValueId> params;
    ValueId loss = kNoValue;
    for (int k = 0; k < 3; ++k) {
      ValueId p = g.parameter("p" + std::to_string(k), wave({64 * (k + 1)}, 0.2 + k, 1.0));
      ValueId x = g.input("x" + std::to_string(k), {DType::f32, {64 * (k + 1)}});
      ValueId term = g.apply1("sum", {g.apply1("mul", {p, x})});
      loss = loss == kNoValue ? term : g.apply1("add", {loss, term});
      params.push_back(p);
    }
    CompileOptions options;
    options.device = d;
    CompiledStep step(g, {loss, params, nn::optimizer_nodes(clipped_adamw()), {}}, options);
    const ValueId norm = nn::grad_norm_value(g);
    for (int s = 0; s < 6; ++s) {
      nn::set_learning_rate(step.executor(), 0.02 / (s + 1));
      Executor::Feeds feeds;
      for (int k = 0; k < 3; ++k)
        feeds["x" + std::to_string(k)] = wave({64 * (k + 1)}, 0.3 * (s + 1) + k, 0.7);
      const std::vector<Tensor>& out = step.train(feeds, {loss, norm});
      step.synchronize();
      norms.push_back(out[1].to(Device::cpu()).to_doubles()[0]);
    }
    if (d.is_cuda()) {
      EXPECT_EQ(step.last_path({loss, norm}, true, true), RunPath::replay);
    }
    std::vector<double> p;
    for (int k = 0; k < 3; ++k) {
      std::vector<double> v =
          step.executor().parameter("p" + std::to_string(k)).to(Device::cpu()).to_doubles();
      p.insert(p.end(), v.begin(), v.end());
    }
    return p;
  };
  std::vector<double> nc, ng;
  const std::vector<double> pc = run(Device::cpu(), nc), pg = run(Device::cuda(), ng);
  expect_close(nc, ng, 1, "norm");
  expect_close(pc, pg, 2, "params");
}

TEST(AdamWCuda, NonFiniteNormIsRaisedAtSynchronizeAndTheStepIsSkipped) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device in this build or machine";
  const std::vector<Tensor> init = {wave({300}, 0.3, 1.0), wave({5}, 0.5, 1.0)};
  OptimizerGraph t(init, clipped_adamw(), Device::cuda());
  t.step({wave({300}, 0.2, 1.0), wave({5}, 0.6, 1.0)}, 0.01);
  const std::vector<double> before = t.values(0);
  Tensor g = wave({5}, 0.6, 1.0);
  g.data<float>()[2] = std::numeric_limits<float>::infinity();
  expect_error(
      [&] {
        t.step({wave({300}, 0.2, 1.0), g}, 0.01);
      },
      {"clip_grad_norm", "the total gradient norm is inf", "the step was skipped"});
  EXPECT_EQ(t.values(0), before);
  EXPECT_EQ(t.state(0, "step").to(Device::cpu()).at(0), 1);
  // The next finite step runs normally.
  t.step({wave({300}, 0.2, 1.0), wave({5}, 0.6, 1.0)}, 0.01);
  EXPECT_EQ(t.state(0, "step").to(Device::cpu()).at(0), 2);
}

}  // namespace
}  // namespace qg
