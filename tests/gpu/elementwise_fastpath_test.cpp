// The specialised CUDA paths of fake_quantize, ste_backward, LSQ, dynamic_range_quantize and
// the INT4 / NF4 packers against the CPU, bit for bit: per-tensor, per-pack and per-element
// qparam lookups, scalar tails, team shapes of the one-pass row and group kernels (and the
// general fallbacks next to them), with NaN, +/-Inf, signed zeros and rounding ties in the
// data. LSQ's scale / zero-point gradients are reductions: 1e-5 relative, and identical bits
// from run to run.
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "gpu_test_util.h"

namespace qg {
namespace {

using testing::run_op;
using testing::same_bits;

// Uniform values in [lo, hi] with every 61st element replaced by an edge value.
Tensor data(const Shape& shape, DType dtype, double lo = -3, double hi = 3, uint64_t seed = 7) {
  const double inf = std::numeric_limits<double>::infinity();
  const double edges[] = {std::nan(""), inf, -inf, 0.0, -0.0, 0.125, -0.375, 1e30, 2.5};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 61 == 5 ? edges[(i / 61) % 9] : dist(rng);
  return Tensor::from_doubles(shape, v, dtype);
}

Tensor filled(const Shape& shape, DType dtype, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& e : v) e = dtype == DType::i32 ? std::floor(dist(rng)) : dist(rng);
  return Tensor::from_doubles(shape, v, dtype);
}

void expect_same(const std::string& op, const std::vector<Tensor>& in, const Attrs& attrs,
                 const std::string& what) {
  auto cpu = run_op(Device::cpu(), op, in, attrs);
  auto gpu = run_op(Device::cuda(), op, in, attrs);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_TRUE(same_bits(cpu[i], gpu[i])) << op << " " << what << " output " << i;
}

struct ScopeCase {
  std::string name;
  Shape x, q;
  Attrs attrs;
};

std::vector<ScopeCase> scope_cases() {
  return {
      {"tensor tail", {257, 1031}, {1}, {}},
      {"tensor packs", {64, 768}, {1}, {}},
      {"channel axis 0 packs", {64, 136}, {64}, {{"scope", "channel"}, {"axis", 0}}},
      {"channel axis 1 packs", {4, 16, 8}, {16}, {{"scope", "channel"}, {"axis", 1}}},
      {"channel axis -1 elements", {33, 40}, {40}, {{"scope", "channel"}, {"axis", -1}}},
      {"token packs", {6, 7, 128}, {6, 7, 1}, {{"scope", "token"}}},
      {"token elements", {6, 7, 129}, {6, 7, 1}, {{"scope", "token"}}},
      {"group 32 packs", {9, 128}, {9, 4}, {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}},
      {"group 32 elements",
       {9, 100},
       {9, 4},
       {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}},
      {"group 4 axis 0",
       {10, 3, 2},
       {3, 3, 2},
       {{"scope", "group"}, {"axis", 0}, {"group_size", 4}}},
  };
}

TEST(GpuFastPaths, FakeQuantizeAndSteMatchCpu) {
  QG_REQUIRE_GPU();
  for (const ScopeCase& c : scope_cases()) {
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      Tensor x = data(c.x, d);
      Tensor s = filled(c.q, DType::f32, 0.01, 0.05, 1);
      Tensor z = filled(c.q, DType::i32, 100, 150, 2);
      std::string what = c.name + " " + dtype_name(d);
      expect_same("fake_quantize", {x, s, z}, c.attrs, what);
      auto fq = run_op(Device::cpu(), "fake_quantize", {x, s, z}, c.attrs);
      expect_same("ste_backward", {data(c.x, d, -1, 1, 9), fq[1]}, {}, what);
    }
  }
  // f64 scale with i64 zero point, signed 4-bit.
  Tensor x = data({1000, 24}, DType::f32);
  expect_same("fake_quantize",
              {x, Tensor::from_doubles({1}, {0.25}, DType::f64),
               Tensor::from_doubles({1}, {-1}, DType::i64)},
              {{"bits", 4}, {"signed", true}}, "f64 scale i64 zp");
}

TEST(GpuFastPaths, LsqMatchesCpuAndIsDeterministic) {
  QG_REQUIRE_GPU();
  // LSQ offers the tensor and channel scopes.
  std::vector<ScopeCase> cases;
  for (const ScopeCase& c : scope_cases())
    if (!c.attrs.has("scope") || c.attrs.get_string("scope") == "channel") cases.push_back(c);
  cases.push_back({"tensor many stretches", {1024, 1031}, {1}, {}});
  cases.push_back({"channel axis 0 odd rows", {7, 13}, {7}, {{"scope", "channel"}, {"axis", 0}}});
  // Many stretches per qparam folded by the last block: 256 (contiguous kernel), and the
  // strided kernel's splits for channels on the last axis.
  cases.push_back({"tensor 256 stretches", {2048, 2048}, {1}, {}});
  cases.push_back(
      {"channel last axis long columns", {8192, 48}, {48}, {{"scope", "channel"}, {"axis", -1}}});
  for (const ScopeCase& c : cases) {
    for (DType d : {DType::f32, DType::bf16}) {
      Tensor x = data(c.x, d, -4, 4);
      Tensor dy = data(c.x, d, -1, 1, 11);
      Tensor s = filled(c.q, DType::f32, 0.01, 0.05, 3);
      Tensor z = filled(c.q, DType::f32, -3, 3, 4);
      // NaN dy would poison the sums on both sides; keep dy finite.
      dy = filled(c.x, d, -1, 1, 12);
      std::string what = c.name + " " + dtype_name(d);
      Attrs attrs = c.attrs;
      attrs.set("signed", true);
      expect_same("lsq_fake_quantize", {x, s, z}, attrs, what);
      auto cpu = run_op(Device::cpu(), "lsq_backward", {dy, x, s, z}, attrs);
      auto gpu = run_op(Device::cuda(), "lsq_backward", {dy, x, s, z}, attrs);
      auto again = run_op(Device::cuda(), "lsq_backward", {dy, x, s, z}, attrs);
      EXPECT_TRUE(same_bits(cpu[0], gpu[0])) << what << " dx";
      for (int o = 1; o <= 2; ++o) {
        EXPECT_TRUE(same_bits(gpu[o], again[o])) << what << " output " << o << " not deterministic";
        std::vector<double> want = cpu[o].to_doubles(), got = gpu[o].to_doubles();
        double scale = 1e-30;
        for (double w : want) scale = std::max(scale, std::abs(w));
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_LE(std::abs(got[i] - want[i]), 1e-5 * scale)
              << what << " output " << o << "[" << i << "]";
      }
    }
  }
}

TEST(GpuFastPaths, DynamicRangeQuantizeMatchesCpu) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape x;
    Attrs attrs;
  };
  const Attrs token{{"scope", "token"}};
  const std::vector<Case> cases = {
      {{64, 4096}, token},  // packs, 128-lane teams, 4 slots
      {{64, 768}, token},   // packs, 32-lane teams
      {{33, 129}, token},   // scalar slots
      {{100, 8}, token},    // one lane per row
      {{4, 16384}, token},  // 512-lane teams
      {{2, 20000}, token},  // too long for registers: general path
      {{9, 128}, {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}},
      {{9, 100}, {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}},
      {{64, 300}, {{"scope", "channel"}, {"axis", 0}}},
      {{300, 64}, {{"scope", "channel"}, {"axis", 1}}},
      {{257, 1031}, {}},
  };
  for (const Case& c : cases) {
    for (DType d : {DType::f32, DType::bf16, DType::f64}) {
      for (const char* mode : {"symmetric", "affine"}) {
        Attrs a = c.attrs;
        a.set("mode", std::string(mode));
        if (std::string(mode) == "affine") {
          a.set("signed", false);
          a.set("narrow_range", false);
        }
        expect_same("dynamic_range_quantize", {data(c.x, d, -2, 5)}, a,
                    shape_str(c.x) + " " + dtype_name(d) + " " + mode);
      }
    }
  }
  // Rows of zeros (signed and unsigned) and rows without finite values.
  std::vector<double> v(4 * 16, 0.0);
  for (int i = 16; i < 32; i += 2) v[i] = -0.0;
  for (int i = 32; i < 48; ++i) v[i] = std::nan("");
  for (int i = 48; i < 64; ++i) v[i] = i % 2 ? std::numeric_limits<double>::infinity() : -0.0;
  expect_same("dynamic_range_quantize", {Tensor::from_doubles({4, 16}, v)}, token, "zero rows");
}

TEST(GpuFastPaths, Int4AndNf4PackMatchCpu) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape x;
    int64_t group;
  };
  // INT4 team shapes: 128 -> 4 lanes x 4 packs, 64 -> 2 x 4, 8 -> 1 x 1, 96 -> 4 x 3,
  // 1024 -> 32 x 4; 40 (5 packs) and 101-long rows take the general path.
  const std::vector<Case> cases = {{{33, 256}, 128}, {{16, 256}, 64},   {{5, 64}, 8},
                                   {{5, 192}, 96},   {{3, 2048}, 1024}, {{4, 80}, 40},
                                   {{7, 101}, 32}};
  for (const Case& c : cases) {
    for (DType d : {DType::f32, DType::bf16, DType::f64}) {
      for (const char* order : {"low_first", "high_first"}) {
        Tensor x = data(c.x, d, -1, 4);
        std::string what =
            shape_str(c.x) + " g" + std::to_string(c.group) + " " + dtype_name(d) + " " + order;
        for (const char* mode : {"symmetric", "asymmetric"})
          expect_same("int4_quantize_pack", {x},
                      {{"group_size", c.group},
                       {"nibble_order", std::string(order)},
                       {"mode", std::string(mode)}},
                      what + " " + mode);
        expect_same("nf4_quantize_pack", {x},
                    {{"group_size", c.group}, {"nibble_order", std::string(order)}}, what);
      }
    }
  }
  // A group of zeros (scale 1 / NaN codes of 0.0) next to a normal one.
  std::vector<double> v(128, 0.0);
  for (int i = 64; i < 128; ++i) v[i] = 0.01 * (i - 90);
  Tensor x = Tensor::from_doubles({2, 64}, v);
  expect_same("int4_quantize_pack", {x}, {{"group_size", 64}}, "zero group");
  expect_same("nf4_quantize_pack", {x}, {{"group_size", 64}}, "zero group");
}

}  // namespace
}  // namespace qg
