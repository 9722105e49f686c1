// The CPU int4_quantize_pack fast paths (SSE4.1 group loops, used for groups along the last
// axis) against the scalar reference, bit for bit: group lengths around the vector widths,
// groups starting at odd flat indices, both nibble orders, both modes, NaN / +-Inf / +-0 /
// all-zero groups and ranges whose width overflows f32, f32/bf16/f16 inputs; and the whole
// op against the element-by-element kernel it replaced (written out below).
#include <gtest/gtest.h>

#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_cpu_runs.h"
#include "tests/ops_int4/fastpath_samples.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

using testing::expect_same_bytes;
using testing::f32_bits;
using testing::fastpath_sample;
using testing::narrow_all;

// A zero bound may differ in sign only (see int4_cpu_runs.h).
void expect_same_bound(float fast, float ref, const char* what, int64_t n) {
  if (fast == 0.0f && ref == 0.0f) return;
  EXPECT_EQ(f32_bits(fast), f32_bits(ref)) << what << " n=" << n;
}

template <typename T>
void check_runs(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (int64_t n : {127, 128, 129, 4095, 4096, 4103}) lengths.push_back(n);
  for (int64_t n : lengths) {
    for (int rep = 0; rep < 4; ++rep) {
      const std::vector<T> x = narrow_all<T>(fastpath_sample(rng, n, rep == 0 ? 0.0 : 0.1));
      const int4_cpu::Range<float> r = int4_cpu::finite_range(x.data(), n);
      const int4_cpu::Range<float> ref = int4_cpu::finite_range_scalar(x.data(), n);
      expect_same_bound(r.min, ref.min, "min", n);
      expect_same_bound(r.max, ref.max, "max", n);
      EXPECT_EQ(f32_bits(r.absmax), f32_bits(ref.absmax)) << "n=" << n;
      EXPECT_EQ(f32_bits(int4_cpu::finite_absmax(x.data(), n)), f32_bits(ref.absmax)) << n;
      EXPECT_EQ(f32_bits(int4_cpu::finite_absmax_scalar(x.data(), n)), f32_bits(ref.absmax));
      const int4::GroupParams<float> params[] = {int4::symmetric_params<float>(ref.absmax),
                                                 int4::asymmetric_params<float>(ref.min, ref.max),
                                                 {1.0f, 1.0f, 8.0f},
                                                 {1e-30f, 1e30f, 3.0f}};
      for (const auto& p : params) {
        for (int64_t first : {0, 1, 2, 7}) {
          for (bool high_first : {false, true}) {
            const size_t bytes = static_cast<size_t>((first + n + 1) / 2 + 1);
            std::vector<uint8_t> fast(bytes, 0), want(bytes, 0);
            int4_cpu::encode_pack(x.data(), n, first, p, high_first, fast.data());
            int4_cpu::encode_pack_scalar(x.data(), n, first, p, high_first, want.data());
            ASSERT_EQ(fast, want) << "n=" << n << " first=" << first << " high_first=" << high_first
                                  << " inv=" << p.inv_scale;
          }
        }
      }
    }
  }
}

TEST(Int4FastPath, GroupLoopsMatchScalarF32) {
  check_runs<float>(1);
}
TEST(Int4FastPath, GroupLoopsMatchScalarBf16) {
  check_runs<bf16>(2);
}
TEST(Int4FastPath, GroupLoopsMatchScalarF16) {
  check_runs<f16>(3);
}

TEST(Int4FastPath, OverflowingRangeKeepsTheScalarCodes) {
  // max - min overflows f32: scale inf, inv 0, so +-Inf times inv is NaN: the one code that
  // leaves the clamp as NaN (see int4_cpu_runs.cpp).
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {3e38f, -3e38f, inf, -inf, 1.0f, std::nanf(""), -0.0f, 2.0f};
  for (int i = 0; i < 4; ++i) x.insert(x.end(), x.begin(), x.begin() + 8);  // 40 elements
  const int4_cpu::Range<float> r = int4_cpu::finite_range_scalar(x.data(), 40);
  const auto p = int4::asymmetric_params<float>(r.min, r.max);
  ASSERT_EQ(p.inv_scale, 0.0f);
  for (bool high_first : {false, true}) {
    std::vector<uint8_t> fast(21, 0), want(21, 0);
    int4_cpu::encode_pack(x.data(), 40, 0, p, high_first, fast.data());
    int4_cpu::encode_pack_scalar(x.data(), 40, 0, p, high_first, want.data());
    EXPECT_EQ(fast, want);
  }
}

// The element-by-element kernel the group loops replaced.
template <typename T>
std::vector<Tensor> reference(const Tensor& x, const Attrs& attrs, bool symmetric,
                              bool high_first) {
  const ScopeLayout l = int4_group_layout("int4_quantize_pack", attrs, x.shape());
  const T* px = x.data<T>();
  Tensor packed = Tensor::zeros({int4::packed_bytes(x.numel())}, DType::u8);
  Tensor scale = Tensor::empty(l.qparam_shape, DType::f32);
  Tensor zp = Tensor::empty(l.qparam_shape, DType::u8);
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t g = 0; g < l.num_groups; ++g)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t a0 = g * l.group_size, a1 = std::min(a0 + l.group_size, l.axis_len);
        std::vector<T> group;
        for (int64_t a = a0; a < a1; ++a) group.push_back(px[(o * l.axis_len + a) * l.inner + i]);
        const auto r = int4_cpu::finite_range_scalar(group.data(), a1 - a0);
        const auto p = symmetric ? int4::symmetric_params<float>(r.absmax)
                                 : int4::asymmetric_params<float>(r.min, r.max);
        const int64_t qi = (o * l.num_groups + g) * l.inner + i;
        scale.data<float>()[qi] = p.scale;
        zp.data<uint8_t>()[qi] = static_cast<uint8_t>(p.zero_point);
        for (int64_t a = a0; a < a1; ++a) {
          const int64_t k = (o * l.axis_len + a) * l.inner + i;
          int4_cpu::encode_pack_scalar(px + k, 1, k, p, high_first, packed.data<uint8_t>());
        }
      }
  return {packed, scale, zp};
}

template <typename T>
void check_op(DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<Shape> shapes = {{1},        {17},     {3, 5},    {7, 33}, {5, 100},
                                     {2, 3, 17}, {9, 131}, {3, 4103}, {4, 256}};
  for (const Shape& shape : shapes) {
    for (int64_t axis : {int64_t{-1}, int64_t{0}}) {
      for (int64_t gs : {128, 16, 5, 7, 1}) {
        for (bool symmetric : {true, false}) {
          for (bool high_first : {false, true}) {
            const std::vector<float> v = fastpath_sample(rng, shape_numel(shape), 0.05);
            Tensor x = Tensor::empty(shape, dtype);
            for (size_t i = 0; i < v.size(); ++i) x.data<T>()[i] = static_cast<T>(v[i]);
            Attrs a = {{"group_size", gs},
                       {"axis", axis},
                       {"mode", symmetric ? "symmetric" : "asymmetric"},
                       {"nibble_order", high_first ? "high_first" : "low_first"}};
            auto got = testing::run_op("int4_quantize_pack", {x}, a);
            auto want = reference<T>(x, a, symmetric, high_first);
            const std::string what = dtype_name(dtype) + std::string(" ") + shape_str(shape) +
                                     " axis " + std::to_string(axis) + " g" + std::to_string(gs) +
                                     (symmetric ? " sym" : " asym") + (high_first ? " hf" : " lf");
            expect_same_bytes(got[0], want[0], what + " packed");
            expect_same_bytes(got[1], want[1], what + " scale");
            expect_same_bytes(got[2], want[2], what + " zero_point");
          }
        }
      }
    }
  }
}

TEST(Int4FastPath, OpMatchesElementwiseReferenceF32) {
  check_op<float>(DType::f32, 11);
}
TEST(Int4FastPath, OpMatchesElementwiseReferenceBf16) {
  check_op<bf16>(DType::bf16, 12);
}
TEST(Int4FastPath, OpMatchesElementwiseReferenceF16) {
  check_op<f16>(DType::f16, 13);
}

}  // namespace
}  // namespace qg
