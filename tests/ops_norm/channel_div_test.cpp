// channel_div (a folded conv-bn's output rescaling): values by hand, its backward op giving
// the same bits on the CPU as the generic broadcast div chain it replaced (div, mul, sum_to,
// neg), the GPU against the CPU (dx bit for bit, ds to the f64-sum order), and bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "autograd/grad.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;

Tensor random_tensor(const Shape& shape, uint64_t seed, double lo, double hi, DType dt) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& e : v) e = dist(rng);
  return Tensor::from_doubles(shape, v, dt);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// x [2, 2, 1, 2] = {1, 3 | 2, 2 || 5, 7 | 4, 4} over channels 0 and 1, s = {2, -4}:
// y = {0.5, 1.5, -0.5, -0.5, 2.5, 3.5, -1, -1}. With dy = 1 everywhere dx = 1 / s[c] and
// ds[c] = -sum(dx * y): channel 0: -(0.5 * (0.5 + 1.5 + 2.5 + 3.5)) = -4;
// channel 1: -(-0.25 * (-0.5 - 0.5 - 1 - 1)) = -0.75.
TEST(ChannelDiv, ValuesAndGradientByHand) {
  Tensor x = Tensor::from_doubles({2, 2, 1, 2}, {1, 3, 2, 2, 5, 7, 4, 4}, DType::f32);
  Tensor s = Tensor::from_doubles({2}, {2, -4}, DType::f32);
  Tensor y = run_op(Device::cpu(), "channel_div", {x, s}, {})[0];
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{0.5, 1.5, -0.5, -0.5, 2.5, 3.5, -1, -1}));
  Tensor dy = Tensor::from_doubles({2, 2, 1, 2}, std::vector<double>(8, 1.0), DType::f32);
  auto g = run_op(Device::cpu(), "channel_div_backward", {dy, y, s}, {});
  EXPECT_EQ(g[0].to_doubles(),
            (std::vector<double>{0.5, 0.5, -0.25, -0.25, 0.5, 0.5, -0.25, -0.25}));
  EXPECT_EQ(g[1].to_doubles(), (std::vector<double>{-4, -0.75}));
}

// The gradients of channel_div equal, byte for byte, those of div by s reshaped to
// [1, C, 1, 1] (what nn::conv_bn built before), in f32 and f64.
TEST(ChannelDiv, SameBitsAsTheBroadcastDivChainOnTheCpu) {
  for (DType dt : {DType::f32, DType::f64}) {
    const Shape xs{3, 5, 4, 7};
    Graph g;
    ValueId x = g.input("x", {dt, xs});
    ValueId s = g.input("s", {dt, {5}});
    ValueId dy = g.input("dy", {dt, xs});
    ValueId fused = g.apply1("channel_div", {x, s});
    ValueId generic =
        g.apply1("div", {x, g.apply1("reshape", {s}, {{"shape", Shape{1, 5, 1, 1}}})});
    // loss = sum(dy * y) makes dy the upstream gradient of each path.
    auto loss_of = [&](ValueId y) { return g.apply1("sum", {g.apply1("mul", {y, dy})}); };
    auto gf = grad(g, loss_of(fused), {x, s});
    auto gg = grad(g, loss_of(generic), {x, s});
    Executor ex(g);
    auto got = ex.run({{"x", random_tensor(xs, 1, -3, 3, dt)},
                       {"s", random_tensor({5}, 2, 0.25, 4, dt)},
                       {"dy", random_tensor(xs, 3, -1, 1, dt)}},
                      {fused, generic, gf[0], gg[0], gf[1], gg[1]});
    EXPECT_TRUE(same_bytes(got[0], got[1])) << dtype_name(dt) << " y";
    EXPECT_TRUE(same_bytes(got[2], got[3])) << dtype_name(dt) << " dx";
    EXPECT_TRUE(same_bytes(got[4], got[5])) << dtype_name(dt) << " ds";
  }
}

TEST(ChannelDivGpu, MatchesTheCpu) {
  QG_REQUIRE_GPU();
  // Planes of 1024 (the per-plane path) and of 3 (the flat path); several stretches per
  // channel in the first.
  for (const Shape& xs : {Shape{64, 8, 32, 32}, Shape{50, 6, 3}}) {
    Tensor x = random_tensor(xs, 4, -3, 3, DType::f32);
    Tensor s = random_tensor({xs[1]}, 5, 0.25, 4, DType::f32);
    Tensor dy = random_tensor(xs, 6, -1, 1, DType::f32);
    Tensor y = run_op(Device::cpu(), "channel_div", {x, s}, {})[0];
    EXPECT_TRUE(same_bytes(y, run_op(Device::cuda(), "channel_div", {x, s}, {})[0]));
    auto cpu = run_op(Device::cpu(), "channel_div_backward", {dy, y, s}, {});
    auto gpu = run_op(Device::cuda(), "channel_div_backward", {dy, y, s}, {});
    EXPECT_TRUE(same_bytes(cpu[0], gpu[0])) << "dx";
    // ds: f64 sums of the same f32 products in another order, rounded once to f32: at most
    // one f32 rounding apart (2^-24 relative, with margin for a tie on the boundary).
    auto a = cpu[1].to_doubles(), b = gpu[1].to_doubles();
    for (size_t c = 0; c < a.size(); ++c)
      EXPECT_LE(std::fabs(a[c] - b[c]), 1.2e-7 * std::fabs(a[c]));
  }
}

TEST(ChannelDivErrors, BadInputsNameTheOpAndValues) {
  Graph g;
  auto in = [&](const std::string& n, Shape s, DType d = DType::f32) { return g.input(n, {d, s}); };
  ValueId x4 = in("x4", {2, 3, 4, 4}), x1 = in("x1", {6});
  ValueId c3 = in("c3", {3}), c4 = in("c4", {4}), c3d = in("c3d", {3}, DType::f64);
  expect_error([&] { g.apply("channel_div", {x1, c3}); }, {"channel_div", "rank >= 2", "f32[6]"});
  expect_error(
      [&] {
        g.apply("channel_div", {x4, c4});
      },
      {"channel_div", "s must be [3]", "f32[4]", "f32[2, 3, 4, 4]"});
  expect_error([&] { g.apply("channel_div", {x4, c3d}); }, {"channel_div", "f64"});
  ValueId x4i = in("x4i", {2, 3, 4, 4}, DType::i32);
  expect_error([&] { g.apply("channel_div", {x4i, c3}); }, {"channel_div", "i32"});
  ValueId dy = in("dy", {2, 3, 4, 5});
  expect_error(
      [&] {
        g.apply("channel_div_backward", {dy, x4, c3});
      },
      {"channel_div_backward", "f32[2, 3, 4, 5]", "must match y"});
}

}  // namespace
}  // namespace qg
