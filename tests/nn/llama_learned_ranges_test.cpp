// Learned weight ranges (QConfig::learned_weight_ranges, nn/learned_ranges.h) on a tiny Llama:
// each weight quantizer is one lsq_fake_quantize reading a "<layer>.weight_scale" parameter
// that starts at the dynamic recipe's qparams, so the first step (loss, logits and the weight
// updates) equals the dynamic recipe's bit for bit; the scales then move and the loss falls;
// conversion to integer weights reads the learned scales (converted logits = QAT logits bit
// for bit); the recipes without a learnable form are named errors.
#include <gtest/gtest.h>

#include <cstring>

#include "nn/convert.h"
#include "nn/learned_ranges.h"
#include "nn/llama.h"
#include "nn/llama_config.h"
#include "runtime/backend.h"
#include "runtime/compile.h"
#include "tests/core/test_util.h"
#include "tests/nn/tiny_llama_util.h"
#include "train/optimizer.h"

namespace qg {
namespace {

using testing::expect_error;

nn::LlamaConfig tiny_config() {
  return testing::tiny_llama_config(1);
}

nn::QConfig learned(const std::string& recipe, int group) {
  nn::QConfig qc = nn::parse_recipe(recipe, group);
  qc.learned_weight_ranges = true;
  return qc;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

struct Case {
  std::string recipe;
  int group;
};
const std::vector<Case> kCases = {
    {"8da4w", 32}, {"8da3w", 64}, {"8da2w", 32}, {"w8a8_dynamic", 32}};

TEST(LlamaLearnedRanges, EachWeightQuantizerLearnsItsScales) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.recipe);
    const nn::QConfig qc = learned(c.recipe, c.group);
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, tiny_config(), 2, 7, qc, 3);
    ASSERT_EQ(m.weights.size(), 8u);  // q, k, v, o, gate, up, down, lm_head
    EXPECT_EQ(testing::count_live_ops(g, "lsq_fake_quantize"), 8);
    for (const nn::WeightQuantizer& w : m.weights) {
      ASSERT_NE(w.learned_scale, kNoValue) << w.layer;
      EXPECT_EQ(w.observer, -1);
      EXPECT_EQ(g.value(w.learned_scale).name, w.layer + ".weight_scale");
      const Shape ws = g.value(w.source).type.shape;
      const Shape want = c.recipe == "w8a8_dynamic" ? Shape{ws[0]} : Shape{ws[0], ws[1] / c.group};
      EXPECT_EQ(g.value(w.learned_scale).type, (TensorType{DType::f32, want})) << w.layer;
      EXPECT_NE(std::find(m.parameters.begin(), m.parameters.end(), w.learned_scale),
                m.parameters.end());
      const Node& lsq = g.node(g.value(w.quantized).producer);
      EXPECT_EQ(lsq.op->name, "lsq_fake_quantize");
      EXPECT_EQ(lsq.attrs.get_real("grad_factor"), 1.0);  // torchao: unscaled autograd
    }
    EXPECT_EQ(nn::learned_scales(m.weights).size(), 8u);
  }
}

// Step 0: the learned model is the dynamic one. Its loss and logits match bit for bit, and
// one Adam step moves every weight by the same bits (the weights' gradients are equal: both
// pass dy where the code is in range).
TEST(LlamaLearnedRanges, FirstStepEqualsTheDynamicRecipeBitForBit) {
  for (const Case& c : kCases)
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::parse_precision("bf16-mixed")}) {
      SCOPED_TRACE(c.recipe + (precision.mixed() ? " bf16-mixed" : " f32"));
      Graph gd, gl;
      const nn::QConfig dyn = nn::parse_recipe(c.recipe, c.group);
      nn::LlamaModel md = nn::build_llama(gd, tiny_config(), 2, 7, dyn, 3, precision);
      nn::LlamaModel ml =
          nn::build_llama(gl, tiny_config(), 2, 7, learned(c.recipe, c.group), 3, precision);
      // The initial scales are the dynamic quantizers' scales of the initial weights.
      Executor probe(gd);
      std::vector<ValueId> scales;
      for (const nn::WeightQuantizer& w : md.weights)
        scales.push_back(gd.node(w.observer).outputs[w.qparam_output]);
      std::vector<Tensor> dyn_scales = probe.run(testing::tiny_llama_feeds(), scales);
      for (size_t i = 0; i < ml.weights.size(); ++i)
        EXPECT_TRUE(
            same_bits(gl.node(gl.value(ml.weights[i].learned_scale).producer).value, dyn_scales[i]))
            << ml.weights[i].layer;

      const nn::OptimizerConfig adam{"adam", 1e-2};
      CompiledStep sd(gd, {md.loss, md.parameters, nn::optimizer_nodes(adam), {}}, {});
      CompiledStep sl(gl, {ml.loss, ml.parameters, nn::optimizer_nodes(adam), {}}, {});
      const auto feeds = testing::tiny_llama_feeds();
      const std::vector<Tensor> fd = sd.forward(feeds, {md.loss, md.logits}, true);
      const std::vector<Tensor> fl = sl.forward(feeds, {ml.loss, ml.logits}, true);
      EXPECT_TRUE(same_bits(fd[0], fl[0]));
      EXPECT_TRUE(same_bits(fd[1], fl[1]));
      const double ld = sd.train(feeds, {md.loss})[0].at(0);
      const double ll = sl.train(feeds, {ml.loss})[0].at(0);
      EXPECT_EQ(ld, ll);
      for (const nn::WeightQuantizer& w : md.weights) {
        const std::string name = gd.value(w.source).name;
        EXPECT_TRUE(same_bits(sd.executor().parameter(name), sl.executor().parameter(name)))
            << name;
      }
    }
}

// Adam moves every parameter about the rate per step; the scales (~0.02 here) take a smaller
// rate (OptimizerConfig::lr_factors), as LmTrainConfig::learned_range_lr_factor sets it.
nn::OptimizerConfig adam_with_scale_factor(const nn::LlamaModel& m, const Graph& g,
                                           const std::string& kind, double lr, double factor) {
  nn::OptimizerConfig opt;
  opt.kind = kind;
  opt.lr = lr;
  for (ValueId s : nn::learned_scales(m.weights)) opt.lr_factors[g.value(s).name] = factor;
  return opt;
}

TEST(LlamaLearnedRanges, ScalesMoveAndTheLossFalls) {
  const nn::QConfig qc = learned("8da4w", 32);
  Graph g;
  nn::LlamaModel m = nn::build_llama(g, tiny_config(), 2, 7, qc, 3);
  CompiledStep step(g,
                    {m.loss,
                     m.parameters,
                     nn::optimizer_nodes(adam_with_scale_factor(m, g, "adamw", 3e-3, 0.01)),
                     {}},
                    {});
  std::vector<Tensor> before;
  for (ValueId s : nn::learned_scales(m.weights))
    before.push_back(step.executor().parameter(g.value(s).name).clone());
  std::vector<double> losses;
  for (int i = 0; i < 12; ++i)
    losses.push_back(step.train(testing::tiny_llama_feeds(), {m.loss})[0].at(0));
  EXPECT_LT(losses.back(), losses.front() - 0.1);
  size_t k = 0;
  for (ValueId s : nn::learned_scales(m.weights)) {
    const Tensor& now = step.executor().parameter(g.value(s).name);
    EXPECT_FALSE(same_bits(now, before[k++])) << g.value(s).name << " never moved";
    for (double v : now.to_doubles()) EXPECT_GT(v, 0.0);
  }
}

// With one rate for everything (torchao's setting) Adam drives some scale of this model
// through zero within a few steps: the quantizer then refuses it by name instead of going on
// with a scale that has no integer form.
TEST(LlamaLearnedRanges, AScaleDrivenThroughZeroIsANamedError) {
  const nn::QConfig qc = learned("8da4w", 32);
  Graph g;
  nn::LlamaModel m = nn::build_llama(g, tiny_config(), 2, 7, qc, 3);
  CompiledStep step(g, {m.loss, m.parameters, nn::optimizer_nodes({"adamw", 3e-3}), {}}, {});
  expect_error(
      [&] {
        for (int i = 0; i < 40; ++i) step.train(testing::tiny_llama_feeds(), {m.loss});
      },
      {"[lsq_fake_quantize]", "must be positive and finite"});
}

// After training (scales away from the dynamic ones), the integer model reads the learned
// scales: its logits equal the QAT model's bit for bit.
TEST(LlamaLearnedRanges, ConvertedLogitsEqualTheQatLogitsBitForBit) {
  for (const Case& c : {Case{"8da4w", 32}, Case{"w8a8_dynamic", 32}})
    for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::parse_precision("bf16-mixed")}) {
      SCOPED_TRACE(c.recipe + (precision.mixed() ? " bf16-mixed" : " f32"));
      const nn::QConfig qc = learned(c.recipe, c.group);
      Graph g;
      nn::LlamaModel m = nn::build_llama(g, tiny_config(), 2, 7, qc, 5, precision);
      CompiledStep step(g,
                        {m.loss,
                         m.parameters,
                         nn::optimizer_nodes(adam_with_scale_factor(m, g, "adam", 1e-2, 0.01)),
                         {}},
                        {});
      for (int s = 0; s < 4; ++s) step.train(testing::tiny_llama_feeds(), {m.loss});
      step.synchronize();
      nn::LlamaInstance inst =
          nn::build_llama_instance(tiny_config(), 2, 7, qc, Device::cpu(), precision);
      nn::copy_states(step.executor(), *inst.exec);
      // The scales trained away from the dynamic qparams of the trained weights.
      const nn::WeightQuantizer& w0 = inst.model.weights[0];
      const Tensor fresh = nn::initial_weight_scale(
          inst.exec->parameter(inst.graph->value(w0.source).name), qc, DType::f32);
      EXPECT_FALSE(
          same_bits(fresh, inst.exec->parameter(inst.graph->value(w0.learned_scale).name)));
      const Tensor qat =
          inst.exec->run(testing::tiny_llama_feeds(), {inst.model.logits})[0].to(Device::cpu());
      nn::convert_to_integer(inst, qc);
      // No learned-range quantizer feeds the logits any more.
      const std::vector<bool> needed = inst.graph->needed_nodes({inst.model.logits});
      for (const nn::WeightQuantizer& w : inst.model.weights)
        EXPECT_FALSE(needed[inst.graph->value(w.quantized).producer]) << w.layer;
      const Tensor converted =
          inst.exec->run(testing::tiny_llama_feeds(), {inst.model.logits})[0].to(Device::cpu());
      EXPECT_TRUE(same_bits(qat, converted));
    }
}

// On a GPU: the converted model's CUDA logits equal the learned QAT model's CUDA logits bit
// for bit (the dequantize ops compute code * scale in f32 as lsq_fake_quantize does).
TEST(LlamaLearnedRanges, OnTheGpuConvertedLogitsEqualTheQatLogitsBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device present";
  for (const auto& precision : {nn::PrecisionPolicy::f32(), nn::parse_precision("bf16-mixed")}) {
    SCOPED_TRACE(precision.mixed() ? "bf16-mixed" : "f32");
    const nn::QConfig qc = learned("8da4w", 32);
    Graph g;
    nn::LlamaModel m = nn::build_llama(g, tiny_config(), 2, 7, qc, 5, precision);
    CompiledStep step(g,
                      {m.loss,
                       m.parameters,
                       nn::optimizer_nodes(adam_with_scale_factor(m, g, "adam", 1e-2, 0.01)),
                       {}},
                      {});
    for (int s = 0; s < 4; ++s) step.train(testing::tiny_llama_feeds(), {m.loss});
    step.synchronize();
    nn::LlamaInstance inst =
        nn::build_llama_instance(tiny_config(), 2, 7, qc, Device::cuda(0), precision);
    nn::copy_states(step.executor(), *inst.exec);
    const Tensor qat =
        inst.exec->run(testing::tiny_llama_feeds(), {inst.model.logits})[0].to(Device::cpu());
    nn::convert_to_integer(inst, qc);
    const Tensor converted =
        inst.exec->run(testing::tiny_llama_feeds(), {inst.model.logits})[0].to(Device::cpu());
    EXPECT_TRUE(same_bits(qat, converted));
  }
}

// Re-initialising from the current weights (after a fine-tune loads other weights) gives the
// dynamic qparams of those weights, and changes nothing else.
TEST(LlamaLearnedRanges, InitializeFromCurrentWeights) {
  const nn::QConfig qc = learned("8da4w", 32);
  nn::LlamaInstance inst = nn::build_llama_instance(tiny_config(), 2, 7, qc, Device::cpu());
  const nn::WeightQuantizer& w = inst.model.weights[2];
  Tensor& weight = inst.exec->parameter(inst.graph->value(w.source).name);
  for (int64_t i = 0; i < weight.numel(); ++i) weight.data<float>()[i] *= 3.0f;
  nn::initialize_learned_ranges(*inst.exec, inst.model.weights, qc);
  const Tensor& scale = inst.exec->parameter(inst.graph->value(w.learned_scale).name);
  EXPECT_TRUE(same_bits(scale, nn::initial_weight_scale(weight, qc, DType::f32)));
  // A scale is the group's largest magnitude over (qmax - qmin) / 2 = 7.5 (f32 steps).
  float amax = 0;
  for (int64_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(weight.data<float>()[k]));
  EXPECT_EQ(scale.data<float>()[0], amax * static_cast<float>(1.0 / 7.5));
}

TEST(LlamaLearnedRanges, RecipesWithoutALearnableFormAreNamedErrors) {
  expect_error([&] { learned("int4_weight_only", 32).validate(); },
               {"[qconfig]", "learned weight ranges", "float zero point", "not learnable"});
  nn::QConfig observed = nn::QConfig::w4a8_group(32);
  observed.learned_weight_ranges = true;
  expect_error([&] { observed.validate(); },
               {"[qconfig]", "learned weight ranges", "dynamic", "(observed)"});
  nn::QConfig float_weights;
  float_weights.learned_weight_ranges = true;
  expect_error([&] { float_weights.validate(); }, {"[qconfig]", "learned weight ranges"});
  Graph g;
  expect_error([&] { nn::build_llama(g, tiny_config(), 2, 7, learned("int4_weight_only", 32), 1); },
               {"[qconfig]", "float_zero"});
  EXPECT_NE(learned("8da4w", 32).str().find("learned ranges"), std::string::npos);
  EXPECT_EQ(nn::parse_recipe("8da4w", 32).str().find("learned"), std::string::npos);
}

}  // namespace
}  // namespace qg
