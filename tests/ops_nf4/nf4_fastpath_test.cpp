// The CPU nf4_quantize_pack fast path (SSE4.1 code loop and int4_cpu::finite_absmax, used
// for groups along the last axis) against the scalar reference, bit for bit: group lengths
// around the vector widths, odd starts, both nibble orders, NaN / +-Inf / +-0 / all-zero
// groups (inv = inf), values on the midpoints, f32/bf16/f16 inputs; and the whole op against
// the element-by-element kernel it replaced (written out below).
#include <gtest/gtest.h>

#include "ops/int4/int4_cpu.h"
#include "ops/int4/int4_cpu_runs.h"
#include "ops/nf4/nf4_cpu_runs.h"
#include "tests/ops_int4/fastpath_samples.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

using testing::expect_same_bytes;
using testing::fastpath_sample;
using testing::narrow_all;

template <typename T>
void check_runs(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (int64_t n : {127, 128, 129, 4095, 4096, 4103}) lengths.push_back(n);
  for (int64_t n : lengths) {
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> v = fastpath_sample(rng, n, rep == 0 ? 0.0 : 0.1);
      // Some values exactly on midpoints (ties go to the lower code) with absmax 1.
      if (rep == 3 && n > 0) {
        for (int64_t j = 0; j < n; j += 3) v[j] = nf4::midpoint<float>(static_cast<int>(j % 15));
        v[0] = 1.0f;
      }
      const std::vector<T> x = narrow_all<T>(v);
      const float amax = int4_cpu::finite_absmax_scalar(x.data(), n);
      for (float inv : {1.0f / amax, 1.0f, 0.0f, 3e38f}) {
        for (int64_t first : {0, 1, 2, 7}) {
          for (bool high_first : {false, true}) {
            const size_t bytes = static_cast<size_t>((first + n + 1) / 2 + 1);
            std::vector<uint8_t> fast(bytes, 0), want(bytes, 0);
            nf4_cpu::encode_pack(x.data(), n, first, inv, high_first, fast.data());
            nf4_cpu::encode_pack_scalar(x.data(), n, first, inv, high_first, want.data());
            ASSERT_EQ(fast, want) << "n=" << n << " first=" << first << " high_first=" << high_first
                                  << " inv=" << inv;
          }
        }
      }
    }
  }
}

TEST(Nf4FastPath, CodeLoopMatchesScalarF32) {
  check_runs<float>(1);
}
TEST(Nf4FastPath, CodeLoopMatchesScalarBf16) {
  check_runs<bf16>(2);
}
TEST(Nf4FastPath, CodeLoopMatchesScalarF16) {
  check_runs<f16>(3);
}

// The element-by-element kernel the group loops replaced.
template <typename T>
std::vector<Tensor> reference(const Tensor& x, const Attrs& attrs, bool high_first) {
  const ScopeLayout l = int4_group_layout("nf4_quantize_pack", attrs, x.shape());
  const T* px = x.data<T>();
  Tensor packed = Tensor::zeros({int4::packed_bytes(x.numel())}, DType::u8);
  Tensor absmax = Tensor::empty(l.qparam_shape, DType::f32);
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t g = 0; g < l.num_groups; ++g)
      for (int64_t i = 0; i < l.inner; ++i) {
        const int64_t a0 = g * l.group_size, a1 = std::min(a0 + l.group_size, l.axis_len);
        std::vector<T> group;
        for (int64_t a = a0; a < a1; ++a) group.push_back(px[(o * l.axis_len + a) * l.inner + i]);
        const float amax = int4_cpu::finite_absmax_scalar(group.data(), a1 - a0);
        absmax.data<float>()[(o * l.num_groups + g) * l.inner + i] = amax;
        for (int64_t a = a0; a < a1; ++a) {
          const int64_t k = (o * l.axis_len + a) * l.inner + i;
          nf4_cpu::encode_pack_scalar(px + k, 1, k, 1.0f / amax, high_first,
                                      packed.data<uint8_t>());
        }
      }
  return {packed, absmax};
}

template <typename T>
void check_op(DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<Shape> shapes = {{1},        {17},     {3, 5},    {7, 33}, {5, 100},
                                     {2, 3, 17}, {9, 131}, {3, 4103}, {4, 256}};
  for (const Shape& shape : shapes) {
    for (int64_t axis : {int64_t{-1}, int64_t{0}}) {
      for (int64_t gs : {64, 16, 5, 7, 1}) {
        for (bool high_first : {false, true}) {
          const std::vector<float> v = fastpath_sample(rng, shape_numel(shape), 0.05);
          Tensor x = Tensor::empty(shape, dtype);
          for (size_t i = 0; i < v.size(); ++i) x.data<T>()[i] = static_cast<T>(v[i]);
          Attrs a = {{"group_size", gs},
                     {"axis", axis},
                     {"nibble_order", high_first ? "high_first" : "low_first"}};
          auto got = testing::run_op("nf4_quantize_pack", {x}, a);
          auto want = reference<T>(x, a, high_first);
          const std::string what = dtype_name(dtype) + std::string(" ") + shape_str(shape) +
                                   " axis " + std::to_string(axis) + " g" + std::to_string(gs) +
                                   (high_first ? " hf" : " lf");
          expect_same_bytes(got[0], want[0], what + " packed");
          expect_same_bytes(got[1], want[1], what + " absmax");
        }
      }
    }
  }
}

TEST(Nf4FastPath, OpMatchesElementwiseReferenceF32) {
  check_op<float>(DType::f32, 11);
}
TEST(Nf4FastPath, OpMatchesElementwiseReferenceBf16) {
  check_op<bf16>(DType::bf16, 12);
}
TEST(Nf4FastPath, OpMatchesElementwiseReferenceF16) {
  check_op<f16>(DType::f16, 13);
}

}  // namespace
}  // namespace qg
