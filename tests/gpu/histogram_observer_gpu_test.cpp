// histogram_observer on the GPU against the CPU reference, bit for bit, over a sequence of
// batches that drives every merge path: the first batch, a repeated range (add), growth
// (combine), a jump by more than 2^31 (rebin), a constant batch, a batch with no finite
// value, an evaluation step and a disabled observer. Outputs and every state tensor are
// compared after each step.
#include <cmath>
#include <limits>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::same_bits;

struct Step {
  std::vector<double> values;
  bool training = true;
  bool enabled = true;
};

std::vector<double> uniform(size_t n, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<Step> merge_path_steps(size_t n) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<Step> s;
  s.push_back({uniform(n, -1, 2, 1)});
  s.push_back({uniform(n, -1, 2, 1)});         // same batch: same range or a combine by rounding
  s.push_back({uniform(n, -5, 9, 2)});         // growth on both sides
  s.push_back({std::vector<double>(n, 0.5)});  // constant batch inside the range
  s.push_back({uniform(n, -2, 1e12, 3)});      // a jump by more than 2^31: rebin by centres
  std::vector<double> bad(n, nan);
  bad[0] = std::numeric_limits<double>::infinity();
  s.push_back({bad});                                   // no finite value: counts only
  s.push_back({uniform(n, -3e12, 0, 4), false});        // evaluation: search only
  s.push_back({uniform(n, -3e12, 0, 5), true, false});  // disabled
  s.push_back({uniform(n, -3e12, 3e12, 6)});
  return s;
}

void expect_same_over_steps(const Shape& shape, const Attrs& attrs, DType dtype,
                            const std::vector<Step>& steps) {
  Graph g;
  ValueId x = g.input("x", {dtype, shape});
  std::vector<ValueId> outs = g.apply("histogram_observer", {x}, attrs, "hist");
  const NodeId node = g.value(outs[0]).producer;
  Executor cpu(g, Device::cpu()), gpu(g, Device::cuda());
  for (size_t k = 0; k < steps.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    const Step& st = steps[k];
    for (Executor* e : {&cpu, &gpu}) {
      e->set_training(st.training);
      Tensor flag = Tensor::from_doubles({1}, {st.enabled ? 1.0 : 0.0}, DType::u8);
      e->state(node, "observer_enabled") = flag.to(e->device());
    }
    Executor::Feeds feeds{{"x", Tensor::from_doubles(shape, st.values, dtype)}};
    std::vector<Tensor> want = cpu.run(feeds, outs);
    std::vector<Tensor> got = gpu.run(feeds, outs);
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_TRUE(same_bits(want[i], got[i].to(Device::cpu()))) << "output " << i;
    const std::vector<Tensor>& ws = cpu.states(node);
    const std::vector<Tensor>& gs = gpu.states(node);
    for (size_t i = 0; i < ws.size(); ++i)
      EXPECT_TRUE(same_bits(ws[i], gs[i].to(Device::cpu()))) << "state " << i;
  }
}

TEST(GpuHistogramObserver, PerTensorEveryMergePath) {
  QG_REQUIRE_GPU();
  expect_same_over_steps({1000}, {{"bins", 64}, {"upsample_rate", 16}}, DType::f32,
                         merge_path_steps(1000));
}

TEST(GpuHistogramObserver, PerTensorManyBlocksDefaultBins) {
  QG_REQUIRE_GPU();
  const size_t n = size_t{1} << 20;
  expect_same_over_steps({1024, 1024}, {}, DType::f32, merge_path_steps(n));
}

TEST(GpuHistogramObserver, PerChannelSymmetricAxis1) {
  QG_REQUIRE_GPU();
  Attrs a = {{"scope", "channel"}, {"axis", 1},   {"qscheme", "symmetric"},
             {"signed", true},     {"bins", 256}, {"upsample_rate", 8}};
  expect_same_over_steps({300, 7}, a, DType::f32, merge_path_steps(2100));
}

TEST(GpuHistogramObserver, HalfInputsAndBinsAboveSharedMemory) {
  QG_REQUIRE_GPU();
  Attrs a = {{"bins", 10000}};
  std::vector<Step> steps = {{uniform(4096, -1, 1, 7)}, {uniform(4096, -4, 1, 8)}};
  expect_same_over_steps({4096}, a, DType::bf16, steps);
  expect_same_over_steps({4096}, a, DType::f16, steps);
}

}  // namespace
}  // namespace qg
