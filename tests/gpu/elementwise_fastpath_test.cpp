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
  // LSQ offers the tensor, channel and group scopes.
  std::vector<ScopeCase> cases;
  for (const ScopeCase& c : scope_cases())
    if (!c.attrs.has("scope") || c.attrs.get_string("scope") != "token") cases.push_back(c);
  // Learned weight ranges: groups of 32 along the rows of an [out, in] weight.
  cases.push_back({"group 32 weight rows",
                   {256, 512},
                   {256, 16},
                   {{"scope", "group"}, {"axis", 1}, {"group_size", 32}}});
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
  // Team shapes (lanes x slots): f32 takes up to 4 packs per lane, the 16-bit types 8.
  const std::vector<Case> cases = {
      {{64, 4096}, token},  // f32 128 x 4; bf16/f16 64 x 8
      {{64, 768}, token},   // f32 32 x 3 (slots 4); 16-bit 16 x 6 (slots 8)
      {{50, 72}, token},    // 9 packs: f32 4 x 3 (slots 4); 16-bit 2 x 5 (slots 8), ragged
      {{33, 129}, token},   // scalar slots
      {{100, 8}, token},    // one lane per row
      {{7, 64}, token},     // f32 2 x 4; 16-bit one lane x 8
      {{4, 16384}, token},  // f32 512 x 4; 16-bit 256 x 8
      {{2, 20000}, token},  // f32: too long for registers, general path; 16-bit 512 x 5 (slots 8)
      {{2, 32768}, token},  // f32 general path; 16-bit 512 x 8, the longest fast row
      {{2, 32776}, token},  // longer than the 16-bit fast path too
      {{9, 128}, {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}},
      {{9, 100}, {{"scope", "group"}, {"axis", -1}, {"group_size", 32}}},
      {{64, 300}, {{"scope", "channel"}, {"axis", 0}}},
      {{300, 64}, {{"scope", "channel"}, {"axis", 1}}},
      {{257, 1031}, {}},
  };
  for (const Case& c : cases) {
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      // affine u8 (zp >= 0) and affine i8 (zp may be negative).
      for (const char* mode : {"symmetric", "affine", "affine signed"}) {
        Attrs a = c.attrs;
        const bool affine = std::string(mode) != "symmetric";
        a.set("mode", std::string(affine ? "affine" : "symmetric"));
        if (affine) {
          a.set("signed", std::string(mode) == "affine signed");
          a.set("narrow_range", false);
        }
        // Mostly positive data: affine signed zero points are then negative.
        expect_same("dynamic_range_quantize", {data(c.x, d, -2, 5)}, a,
                    shape_str(c.x) + " " + dtype_name(d) + " " + mode);
      }
    }
  }
  // Rows of zeros (signed and unsigned) and rows without finite values, 16, 64 and 4096
  // long (16-bit types: one lane x 2 and x 8 slots, 64 lanes x 8), rows where only some
  // lanes of the team see a finite value (the others fold +inf / -inf), a row of f16
  // subnormals (a flush to zero in the half-wise range would give scale 1) and one of
  // f32 / bf16 subnormals below a normal maximum (a flush would change the affine scale).
  for (int64_t len : {16, 64, 4096}) {
    std::vector<double> v(static_cast<size_t>(8 * len), 0.0);
    const double inf = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < len; ++i) {
      v[len + i] = i % 2 ? -0.0 : 0.0;
      v[2 * len + i] = std::nan("");
      v[3 * len + i] = i % 3 == 0 ? inf : (i % 3 == 1 ? -inf : -std::nan(""));
      v[4 * len + i] = i == len / 2 ? -0.75 : (i % 2 ? inf : std::nan(""));
      v[5 * len + i] = i == 0 ? 3.5 : (i == len - 1 ? -1e-3 : -inf);
      v[6 * len + i] = 3e-6 * static_cast<double>(i % 5 - 2);  // f16 subnormals
      // f32 / bf16 subnormal minimum: the affine scale (1e-35 + 1e-39 * k) / 255 sees it.
      v[7 * len + i] = i == len - 1 ? 1e-35 : -1e-39 * static_cast<double>(1 + i % 3);
    }
    for (DType d : {DType::f32, DType::bf16, DType::f16}) {
      Tensor x = Tensor::from_doubles({8, len}, v, d);
      const std::string what = "special rows " + std::to_string(len) + " " + dtype_name(d);
      expect_same("dynamic_range_quantize", {x}, token, what);
      Attrs affine = token;
      affine.set("mode", std::string("affine"));
      affine.set("narrow_range", false);
      expect_same("dynamic_range_quantize", {x}, affine, what + " affine");
    }
  }
}

TEST(GpuFastPaths, Int4AndNf4PackMatchCpu) {
  QG_REQUIRE_GPU();
  struct Case {
    Shape x;
    int64_t group;
  };
  // INT4 team shapes, f32 (up to 4 packs per lane) / 16-bit (up to 8): 128 -> 4 x 4 /
  // 2 x 8, 64 -> 2 x 4 / 1 x 8, 8 -> 1 x 1, 96 -> 4 x 3 / 2 x 6, 1024 -> 32 x 4 / 16 x 8;
  // 40 (5 packs) and 56 (7): general path / 1 x 5, 1 x 7; 72 (9 packs) and 101-long rows
  // take the general path. NF4 takes up to 2 packs per lane for every type.
  const std::vector<Case> cases = {{{33, 256}, 128}, {{16, 256}, 64},   {{5, 64}, 8},
                                   {{5, 192}, 96},   {{3, 2048}, 1024}, {{4, 80}, 40},
                                   {{6, 112}, 56},   {{3, 144}, 72},    {{7, 101}, 32}};
  for (const Case& c : cases) {
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
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
  // 128-long groups of 16-bit types (2 lanes x 8 packs): signed zeros, no finite value,
  // one finite value (the other lane folds nothing: min +inf, max -inf, absmax 0), NaN and
  // +/-Inf around a small range, f16 subnormals, f32 / bf16 subnormals below a normal max.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> g(7 * 128, 0.0);
  for (int i = 0; i < 128; ++i) {
    g[i] = i % 2 ? -0.0 : 0.0;
    g[128 + i] = i % 3 == 0 ? inf : (i % 3 == 1 ? -inf : std::nan(""));
    g[256 + i] = i == 5 ? -2.5 : (i % 2 ? -inf : std::nan(""));
    g[384 + i] = i == 77 ? 0.25 : inf;
    g[512 + i] = i % 7 == 0 ? (i % 2 ? inf : -std::nan("")) : 0.001 * (i - 64);
    g[640 + i] = 3e-6 * static_cast<double>(i % 5 - 2);                       // f16 subnormals
    g[768 + i] = i == 127 ? 1e-35 : -1e-39 * static_cast<double>(1 + i % 3);  // f32 / bf16
  }
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    Tensor gx = Tensor::from_doubles({7, 128}, g, d);
    for (const char* order : {"low_first", "high_first"}) {
      for (const char* mode : {"symmetric", "asymmetric"})
        expect_same("int4_quantize_pack", {gx},
                    {{"group_size", 128},
                     {"nibble_order", std::string(order)},
                     {"mode", std::string(mode)}},
                    std::string("special groups ") + dtype_name(d) + " " + order + " " + mode);
      expect_same("nf4_quantize_pack", {gx},
                  {{"group_size", 128}, {"nibble_order", std::string(order)}},
                  std::string("special groups ") + dtype_name(d) + " " + order);
    }
  }
}

// The INT4 packer's finite fast path (Int4Codec::kFiniteFastPath: a warp whose groups hold
// no +/-Inf skips the finite filter and most code clamps). data() puts +/-Inf into every
// warp, so these groups take NaN, signed zeros, subnormals, a range wider than the type,
// all-subnormal groups (scale 1), a tie at the top of an asymmetric range (rint(max * inv)
// + zp = 16 before the clamp) and random ranges; a +Inf in row 20 sends the third warp
// (rows 16..23: 8 groups of 128 or 16 of 64 per warp) down the filtered path.
TEST(GpuFastPaths, Int4PackFiniteWarpsMatchCpu) {
  QG_REQUIRE_GPU();
  const double nan = std::nan("");
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    const double big = d == DType::f16 ? 6e4 : 3e38;
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> dist(-3, 3);
    std::vector<double> g(24 * 128);
    for (int i = 0; i < 128; ++i) {
      g[i] = i % 2 ? -0.0 : 0.0;
      g[128 + i] = nan;
      g[256 + i] = i % 5 == 0 ? nan : 0.01 * (i - 64);
      g[384 + i] = i == 77 ? 0.25 : nan;
      g[512 + i] = 3e-6 * static_cast<double>(i % 5 - 2);
      g[640 + i] = i == 127 ? 1e-35 : -1e-39 * static_cast<double>(1 + i % 3);
      g[768 + i] = 1e-40 * static_cast<double>(i % 7 - 3);
      g[896 + i] = i % 3 == 0 ? big : -big * static_cast<double>(i % 3) / 2;
      const double tie[] = {-0.25, 2.25, 1.0, 0.5};  // inv 6, zp 2, 2.25 * 6 = 13.5
      g[1024 + i] = tie[i % 4];
      for (int k = 9; k < 24; ++k) g[k * 128 + i] = dist(rng) * static_cast<double>(k - 8);
    }
    g[20 * 128 + 40] = std::numeric_limits<double>::infinity();
    Tensor x = Tensor::from_doubles({24, 128}, g, d);
    for (int64_t group : {128, 64})
      for (const char* order : {"low_first", "high_first"})
        for (const char* mode : {"symmetric", "asymmetric"})
          expect_same("int4_quantize_pack", {x},
                      {{"group_size", group},
                       {"nibble_order", std::string(order)},
                       {"mode", std::string(mode)}},
                      std::string("finite warps g") + std::to_string(group) + " " + dtype_name(d) +
                          " " + order + " " + mode);
  }
}

}  // namespace
}  // namespace qg
