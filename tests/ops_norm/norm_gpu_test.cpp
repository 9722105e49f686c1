// The CUDA batch_norm / layer_norm kernels against the CPU reference: outputs, saved
// statistics, running-stat updates and gradients agree to the f64-sum order (1e-5 relative
// in f32, as the crosscheck's rows for these ops), and repeated GPU runs give the same bits
// (no atomics). Skips without a GPU.
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::run_op;
using testing::same_bits;

Tensor random_tensor(const Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& e : v) e = dist(rng);
  return Tensor::from_doubles(shape, v, DType::f32);
}

void expect_close(const Tensor& cpu, const Tensor& gpu, double rel = 1e-5) {
  std::vector<double> a = cpu.to_doubles(), b = gpu.to_doubles();
  ASSERT_EQ(a.size(), b.size());
  double scale = 1e-30, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(a[i]));
    err = std::max(err, std::fabs(a[i] - b[i]));
  }
  EXPECT_LE(err / scale, rel) << "max |cpu - gpu| " << err << " against max |cpu| " << scale;
}

// Runs batch_norm with parameter buffers on `device` for two training steps (the second
// frozen when `freeze`), then its backward; returns every output and the buffers.
std::vector<Tensor> bn_run(Device device, const Shape& shape, bool freeze) {
  const int64_t c = shape[1];
  Graph g;
  ValueId x = g.input("x", {DType::f32, shape});
  ValueId ga = g.constant(random_tensor({c}, 2, 0.5, 1.5));
  ValueId be = g.constant(random_tensor({c}, 3));
  ValueId rm = g.parameter("rm", random_tensor({c}, 4));
  ValueId rv = g.parameter("rv", random_tensor({c}, 5, 0.5, 2.0));
  auto out = g.apply("batch_norm", {x, ga, be, rm, rv}, {}, "bn");
  ValueId dy = g.input("dy", {DType::f32, shape});
  auto grads = g.apply("batch_norm_backward", {dy, x, ga, out[1], out[2], out[3]});
  Executor exec(g, device);
  Executor::Feeds feeds = {{"x", random_tensor(shape, 6).to(device)},
                           {"dy", random_tensor(shape, 7).to(device)}};
  exec.run(feeds, {out[0]});
  if (freeze) {
    Tensor flag = Tensor::from_doubles({1}, {1.0}, DType::f32);
    exec.state(g.value(out[0]).producer, "frozen") = flag.to(device);
  }
  auto got = exec.run(feeds, {out[0], out[1], out[2], out[3], grads[0], grads[1], grads[2]});
  got.push_back(exec.parameter("rm"));
  got.push_back(exec.parameter("rv"));
  for (Tensor& t : got) t = t.to(Device::cpu());
  return got;
}

TEST(NormGpu, BatchNormMatchesTheCpu) {
  QG_REQUIRE_GPU();
  for (Shape shape : {Shape{4, 3, 5, 7}, Shape{64, 16, 9, 9}, Shape{300, 8}, Shape{2, 5, 1, 1}})
    for (bool freeze : {false, true}) {
      SCOPED_TRACE(shape_str(shape) + (freeze ? " frozen" : ""));
      auto cpu = bn_run(Device::cpu(), shape, freeze);
      auto gpu = bn_run(Device::cuda(), shape, freeze);
      ASSERT_EQ(cpu.size(), gpu.size());
      for (size_t i = 0; i < cpu.size(); ++i) {
        SCOPED_TRACE("output " + std::to_string(i));
        expect_close(cpu[i], gpu[i]);
      }
      auto again = bn_run(Device::cuda(), shape, freeze);
      for (size_t i = 0; i < gpu.size(); ++i) EXPECT_TRUE(same_bits(gpu[i], again[i])) << i;
    }
}

TEST(NormGpu, LayerNormMatchesTheCpu) {
  QG_REQUIRE_GPU();
  // Row lengths for each form of the dx kernel: a warp per row with 8, 16 or 32 slots a lane
  // (full and partial), and the block-per-row kernel above 1024.
  for (Shape shape : {Shape{4, 7}, Shape{3, 100, 768}, Shape{4096, 32}, Shape{50, 300},
                      Shape{9, 1024}, Shape{5, 1025}, Shape{2, 3000}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t d = shape.back();
    std::vector<Tensor> in = {random_tensor(shape, 1), random_tensor({d}, 2, 0.5, 1.5),
                              random_tensor({d}, 3)};
    auto cpu = run_op(Device::cpu(), "layer_norm", in);
    auto gpu = run_op(Device::cuda(), "layer_norm", in);
    for (size_t i = 0; i < cpu.size(); ++i) expect_close(cpu[i], gpu[i]);
    std::vector<Tensor> bin = {random_tensor(shape, 4), in[0], in[1], cpu[1], cpu[2]};
    auto bcpu = run_op(Device::cpu(), "layer_norm_backward", bin);
    auto bgpu = run_op(Device::cuda(), "layer_norm_backward", bin);
    for (size_t i = 0; i < bcpu.size(); ++i) expect_close(bcpu[i], bgpu[i]);
    auto again = run_op(Device::cuda(), "layer_norm_backward", bin);
    for (size_t i = 0; i < bgpu.size(); ++i) EXPECT_TRUE(same_bits(bgpu[i], again[i]));
  }
}

}  // namespace
}  // namespace qg
