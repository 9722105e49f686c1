// The CPU dynamic_range_quantize fast paths (SSE4.1 run loops, and the kernel's per-run
// walk) against the scalar reference, bit for bit: run loops of every length around the
// vector widths, with NaN, +-Inf, +-0 and all-zero runs, f32/bf16/f16 inputs, s8 and u8
// codes; and the whole op, for every scope and both modes, against the element-by-element
// kernel it replaced (written out below with the same shared math).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/half.h"
#include "ops/common/quant_scope.h"
#include "ops/dynamic_quant/dynamic_quant_cpu_runs.h"
#include "ops/dynamic_quant/dynamic_quant_math.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

using testing::expect_same_bytes;
using testing::run_op;

const float kInf = std::numeric_limits<float>::infinity();

// Normal values at a random magnitude, with specials sprinkled in at rate `special`, and
// now and then a run of zeros.
std::vector<float> sample(std::mt19937& rng, int64_t n, double special) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = normal(rng) * mag;
    if (u(rng) < special) {
      const float specials[] = {std::nanf(""), -std::nanf(""), kInf,        -kInf, 0.0f,
                                -0.0f,         mag * 0.5f,     -mag * 0.5f, 1e-39f};
      x = specials[rng() % 9];
    }
  }
  if (rng() % 8 == 0) std::fill(v.begin(), v.end(), rng() % 2 ? 0.0f : -0.0f);
  if (rng() % 16 == 0) std::fill(v.begin(), v.end(), std::nanf(""));
  return v;
}

template <typename T>
std::vector<T> narrow(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return out;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Equal bounds; a zero bound may differ in sign only (see dynamic_quant_cpu_runs.h).
void expect_same_bound(float fast, float ref, const char* what, int64_t n) {
  if (fast == 0.0f && ref == 0.0f) return;
  EXPECT_EQ(bits(fast), bits(ref)) << what << " n=" << n << " fast=" << fast << " ref=" << ref;
}

template <typename T, typename Q>
void check_runs(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (int64_t n : {127, 128, 129, 4095, 4096, 4103}) lengths.push_back(n);
  const bool is_signed = std::is_signed_v<Q>;
  for (int64_t n : lengths) {
    for (int rep = 0; rep < 4; ++rep) {
      const std::vector<T> x = narrow<T>(sample(rng, n, rep == 0 ? 0.0 : 0.1));
      float lo = kInf, hi = -kInf, rlo = kInf, rhi = -kInf;
      dynq_cpu::finite_range(x.data(), n, &lo, &hi);
      dynq_cpu::finite_range_scalar(x.data(), n, &rlo, &rhi);
      expect_same_bound(lo, rlo, "lo", n);
      expect_same_bound(hi, rhi, "hi", n);
      // Codes under the qparams the op would use, and under extreme ones.
      const int32_t qmin = is_signed ? (rep % 2 ? -128 : -127) : 0, qmax = is_signed ? 127 : 255;
      const bool symmetric = is_signed && rep % 2 == 0;
      dynq::QParams p = dynq::qparams(rlo, rhi, rlo <= rhi, symmetric, qmin, qmax);
      if (p.overflow) continue;
      const float qmin_f = static_cast<float>(qmin), qmax_f = static_cast<float>(qmax);
      for (float inv : {1.0f / p.scale, 1.0f, 3e38f, 1e-30f}) {
        const float zp = static_cast<float>(p.zero_point);
        std::vector<Q> fast(static_cast<size_t>(n) + 1, Q(77)), ref(fast);
        dynq_cpu::quantize_run(x.data(), n, inv, zp, qmin_f, qmax_f, fast.data());
        dynq_cpu::quantize_run_scalar(x.data(), n, inv, zp, qmin_f, qmax_f, ref.data());
        ASSERT_EQ(fast, ref) << "n=" << n << " inv=" << inv << " zp=" << zp;
      }
    }
  }
}

TEST(DynamicQuantFastPath, RunLoopsMatchScalarF32) {
  check_runs<float, int8_t>(1);
  check_runs<float, uint8_t>(2);
}
TEST(DynamicQuantFastPath, RunLoopsMatchScalarBf16) {
  check_runs<bf16, int8_t>(3);
  check_runs<bf16, uint8_t>(4);
}
TEST(DynamicQuantFastPath, RunLoopsMatchScalarF16) {
  check_runs<f16, int8_t>(5);
  check_runs<f16, uint8_t>(6);
}

// The element-by-element kernel the run walk replaced: ranges, qparams, then codes.
template <typename T, typename Q>
std::vector<Tensor> reference(const Tensor& x, const Attrs& attrs, int32_t qmin, int32_t qmax,
                              bool symmetric) {
  const ScopeLayout l = scope_layout("dynamic_range_quantize", attrs, x.shape());
  const T* px = x.data<T>();
  std::vector<float> lo(l.num_qparams, kInf), hi(l.num_qparams, -kInf);
  auto index = [&](int64_t k) {
    const int64_t i = k % l.inner, a = (k / l.inner) % l.axis_len, o = k / (l.inner * l.axis_len);
    return qparam_index(l, o, a, i);
  };
  for (int64_t k = 0; k < x.numel(); ++k) {
    const int64_t q = index(k);
    dynq_cpu::finite_range_scalar(px + k, 1, &lo[q], &hi[q]);
  }
  Tensor q_t = Tensor::empty(x.shape(), std::is_signed_v<Q> ? DType::i8 : DType::u8);
  Tensor scale = Tensor::empty(l.qparam_shape, DType::f32);
  Tensor zp = Tensor::empty(l.qparam_shape, DType::i32);
  std::vector<float> inv(l.num_qparams), zpf(l.num_qparams);
  for (int64_t q = 0; q < l.num_qparams; ++q) {
    dynq::QParams p = dynq::qparams(lo[q], hi[q], lo[q] <= hi[q], symmetric, qmin, qmax);
    scale.data<float>()[q] = p.scale;
    zp.data<int32_t>()[q] = p.zero_point;
    inv[q] = 1.0f / p.scale;
    zpf[q] = static_cast<float>(p.zero_point);
  }
  for (int64_t k = 0; k < x.numel(); ++k) {
    const int64_t q = index(k);
    dynq_cpu::quantize_run_scalar(px + k, 1, inv[q], zpf[q], static_cast<float>(qmin),
                                  static_cast<float>(qmax), q_t.data<Q>() + k);
  }
  return {q_t, scale, zp};
}

template <typename T>
void check_op(DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<Shape> shapes = {{1},      {17},       {3, 5},   {7, 33},
                                     {5, 100}, {2, 3, 17}, {9, 131}, {3, 4103}};
  struct Scope {
    std::string scope;
    int64_t axis, group_size;
  };
  const std::vector<Scope> scopes = {{"tensor", 0, 1},   {"token", -1, 1},  {"channel", 0, 1},
                                     {"channel", -1, 1}, {"group", -1, 16}, {"group", -1, 5},
                                     {"group", -1, 128}, {"group", 0, 2}};
  struct Range {
    int32_t qmin, qmax;
    bool symmetric;
  };
  const std::vector<Range> ranges = {{-127, 127, true}, {-128, 127, true},  {-8, 7, true},
                                     {0, 255, false},   {-128, 127, false}, {3, 200, false}};
  for (const Shape& shape : shapes) {
    for (const Scope& s : scopes) {
      if (s.scope == "group" && s.axis == 0 && shape.size() < 2) continue;
      for (const Range& r : ranges) {
        const std::vector<float> v = sample(rng, shape_numel(shape), 0.05);
        Tensor x = Tensor::empty(shape, dtype);
        for (size_t i = 0; i < v.size(); ++i) x.data<T>()[i] = static_cast<T>(v[i]);
        Attrs a = {{"scope", s.scope},           {"axis", s.axis},
                   {"group_size", s.group_size}, {"quant_min", r.qmin},
                   {"quant_max", r.qmax},        {"mode", r.symmetric ? "symmetric" : "affine"}};
        auto got = run_op("dynamic_range_quantize", {x}, a);
        auto want = r.qmin < 0 ? reference<T, int8_t>(x, a, r.qmin, r.qmax, r.symmetric)
                               : reference<T, uint8_t>(x, a, r.qmin, r.qmax, r.symmetric);
        const std::string what = dtype_name(dtype) + std::string(" ") + shape_str(shape) + " " +
                                 s.scope + " axis " + std::to_string(s.axis) + " g" +
                                 std::to_string(s.group_size) + " [" + std::to_string(r.qmin) +
                                 ", " + std::to_string(r.qmax) + "]";
        expect_same_bytes(got[0], want[0], what + " q");
        expect_same_bytes(got[1], want[1], what + " scale");
        expect_same_bytes(got[2], want[2], what + " zero_point");
      }
    }
  }
}

TEST(DynamicQuantFastPath, OpMatchesElementwiseReferenceF32) {
  check_op<float>(DType::f32, 11);
}
TEST(DynamicQuantFastPath, OpMatchesElementwiseReferenceBf16) {
  check_op<bf16>(DType::bf16, 12);
}
TEST(DynamicQuantFastPath, OpMatchesElementwiseReferenceF16) {
  check_op<f16>(DType::f16, 13);
}

}  // namespace
}  // namespace qg
