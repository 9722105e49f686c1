// The SSE fake_quantize / ste_backward loops against an element-by-element reference built
// here from qmath::fake_quant and Eigen's conversions, bit for bit: adversarial values
// (halfway points, qmin/qmax edges, +/-0, NaN payloads, +/-Inf, subnormals, every f16/bf16
// bit pattern), unaligned starts, every tail length, and every scope through the op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "ops/common/quant_math.h"
#include "ops/fake_quantize/fake_quantize_simd.h"
#include "tests/ops_quantize/op_runner.h"

namespace qg {
namespace {

template <typename T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(static_cast<void*>(&v), &b, sizeof(T));
  return v;
}

struct QP {
  float scale, zp, qmin, qmax;
};

// One element as SEMANTICS.md defines it, in f32, narrowed back to T.
template <typename T>
T reference_one(T x, float scale, float zp, float qmin, float qmax, bool* in_range) {
  auto r = qmath::fake_quant<float>(static_cast<float>(x), 1.0f / scale, scale, zp, qmin, qmax);
  *in_range = r.in_range;
  return static_cast<T>(r.y);
}

// Values that stress each step of the math for qparams p, then narrowed to T.
template <typename T>
std::vector<T> adversarial(const QP& p, uint32_t seed) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          from_bits<float>(0x7fc00000u),
                          from_bits<float>(0xffc00000u),
                          from_bits<float>(0x7f800001u),
                          from_bits<float>(0xffa12345u),
                          from_bits<float>(0x7fc0ffffu),
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          1e-40f,
                          -3e-39f,
                          std::numeric_limits<float>::min(),
                          -std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          8388608.0f,
                          8388609.0f,
                          -8388607.5f,
                          16777216.0f,
                          4194303.5f,
                          -4194302.5f,
                          1e30f,
                          -1e30f,
                          65504.0f,
                          65520.0f,
                          -65536.0f,
                          6.1e-5f,
                          -5.9e-8f};
  // Every code around the ends of the range and around zero, at, halfway to and just off
  // each integer multiple of the scale (both signs).
  auto near = [&](double k) {
    for (double d : {-1.0, -0.5, 0.0, 0.5, 1.0}) {
      float c = static_cast<float>((k + d) * p.scale);
      for (float s : {c, -c, std::nextafter(c, inf), std::nextafter(c, -inf)}) v.push_back(s);
    }
  };
  for (double base : {double(p.qmin) - p.zp, double(p.qmax) - p.zp, 0.0})
    for (int k = -3; k <= 3; ++k) near(base + k);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float spread = (p.qmax - p.qmin) * p.scale;
  for (int i = 0; i < 400; ++i) v.push_back(normal(rng) * spread);
  for (int i = 0; i < 400; ++i) v.push_back(std::round(normal(rng) * 40.0f) * 0.5f * p.scale);
  std::vector<T> out;
  for (float f : v) out.push_back(static_cast<T>(f));
  if (sizeof(T) == 2)
    for (uint32_t b = 0; b < 65536; ++b) out.push_back(from_bits<T>(b));
  else
    for (int i = 0; i < 20000; ++i) out.push_back(from_bits<T>(rng()));
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

const std::vector<QP> kQParams = {
    {0.25f, 128, 0, 255},                 // power-of-two scale: exact halfway points
    {1.0f, 0, -128, 127},                 // unit scale, zero at the middle
    {0.02f, 3, -8, 7},                    // 4-bit signed, zp off centre
    {3.7f, 0, -32768, 32767},             // 16-bit
    {1e-39f, 5, 0, 15},                   // 1 / scale overflows: 0 * Inf gives NaN codes
    {9.5367431640625e-7f, 0, -128, 127},  // f16 outputs are subnormal
    {1000.0f, 128, 0, 255},               // f16 outputs overflow to Inf
    {0.1f, 1, -2, 1},                     // 2-bit
};

// Runs fn(x + off, y + off, mask, first, n) over unaligned starts and every short length,
// then over the whole array, checking y bits, mask bits and untouched surroundings.
template <typename T, typename Fn>
void check_runs(const std::vector<T>& x, const std::vector<T>& want, const std::vector<bool>& in,
                const std::string& what, Fn&& fn) {
  std::vector<std::pair<int64_t, int64_t>> cases;  // (offset, length)
  for (int64_t off = 0; off < 9; ++off)
    for (int64_t n = 0; n < 40; ++n) cases.push_back({off, n});
  const int64_t total = static_cast<int64_t>(x.size());
  for (int64_t off : {0, 1, 5}) cases.push_back({off, total - off});
  const T sentinel = from_bits<T>(0x5a5a5a5a5a5a5a5aull);
  for (auto [off, n] : cases)
    for (int64_t shift : {0, 3, 8}) {
      int64_t first = off + shift;
      std::vector<T> y(x.size(), sentinel);
      std::vector<uint8_t> mask((first + n + 7) / 8 + 1, 0xa5);
      for (int64_t j = 0; j < n; ++j) mask[(first + j) >> 3] &= ~(1u << ((first + j) & 7));
      std::vector<uint8_t> before = mask;
      fn(x.data() + off, y.data() + off, mask.data(), first, n, off);
      int bad = 0;
      for (int64_t k = 0; k < total && bad < 5; ++k) {
        bool inside = k >= off && k < off + n;
        uint64_t got = bits_of(y[k]), exp = bits_of(inside ? want[k] : sentinel);
        if (got != exp) {
          ++bad;
          ADD_FAILURE() << what << " off " << off << " n " << n << " first " << first << ": y[" << k
                        << "] x bits " << std::hex << bits_of(x[k]) << " got " << got << " want "
                        << exp;
        }
      }
      for (int64_t b = 0; b < (first + n + 7) / 8 + 1 && bad < 5; ++b)
        for (int e = 0; e < 8; ++e) {
          int64_t bit = b * 8 + e;
          bool inside = bit >= first && bit < first + n;
          bool got = (mask[b] >> e) & 1,
               exp = inside ? in[bit - first + off] : ((before[b] >> e) & 1);
          if (got != exp) {
            ++bad;
            ADD_FAILURE() << what << " off " << off << " n " << n << " first " << first
                          << ": mask bit " << bit << " got " << got << " want " << exp;
          }
        }
      if (bad) return;
    }
}

template <typename T>
void check_const_runs(const char* name) {
  for (size_t qi = 0; qi < kQParams.size(); ++qi) {
    const QP& p = kQParams[qi];
    std::vector<T> x = adversarial<T>(p, 11 + static_cast<uint32_t>(qi));
    std::vector<T> want(x.size());
    std::vector<bool> in(x.size());
    for (size_t k = 0; k < x.size(); ++k) {
      bool r;
      want[k] = reference_one(x[k], p.scale, p.zp, p.qmin, p.qmax, &r);
      in[k] = r;
    }
    fq_simd::RunQParams rp{1.0f / p.scale, p.scale, p.zp, p.qmin, p.qmax};
    check_runs(x, want, in, std::string(name) + " qparams #" + std::to_string(qi),
               [&](const T* px, T* py, uint8_t* m, int64_t first, int64_t n, int64_t) {
                 fq_simd::fake_quant_run(px, py, m, first, n, rp);
               });
  }
}

template <typename T>
void check_lane_runs(const char* name) {
  // Per-element qparams cycling through scales and zero points of one 8-bit range.
  std::vector<T> x = adversarial<T>({0.05f, 0, -128, 127}, 5);
  std::vector<float> inv(x.size()), scale(x.size()), zp(x.size());
  const float scales[] = {0.05f, 0.25f, 1e-39f, 3.0f, 0.0078125f, 0.3f, 7.5f};
  const float zps[] = {0, -128, 127, 5, -3};
  std::vector<T> want(x.size());
  std::vector<bool> in(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    scale[k] = scales[k % 7];
    zp[k] = zps[k % 5];
    inv[k] = 1.0f / scale[k];
    bool r;
    want[k] = reference_one(x[k], scale[k], zp[k], -128.0f, 127.0f, &r);
    in[k] = r;
  }
  check_runs(x, want, in, std::string(name) + " per-element qparams",
             [&](const T* px, T* py, uint8_t* m, int64_t first, int64_t n, int64_t off) {
               fq_simd::LaneQParams lp{inv.data() + off, scale.data() + off, zp.data() + off,
                                       -128.0f, 127.0f};
               fq_simd::fake_quant_lanes(px, py, m, first, n, lp);
             });
}

TEST(FakeQuantizeSimd, ConstantQParamsF32) {
  check_const_runs<float>("f32");
}
TEST(FakeQuantizeSimd, ConstantQParamsBF16) {
  check_const_runs<bf16>("bf16");
}
TEST(FakeQuantizeSimd, ConstantQParamsF16) {
  check_const_runs<f16>("f16");
}
TEST(FakeQuantizeSimd, PerElementQParams) {
  check_lane_runs<float>("f32");
  check_lane_runs<bf16>("bf16");
  check_lane_runs<f16>("f16");
}

template <typename T>
void check_ste() {
  std::mt19937_64 rng(3);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1001}) {
    std::vector<T> dy(n + 1), dx(n + 1, from_bits<T>(0x1234));
    for (auto& v : dy) v = from_bits<T>(rng());  // NaN payloads included
    std::vector<uint8_t> mask((n + 7) / 8);
    for (auto& m : mask) m = static_cast<uint8_t>(rng());
    fq_simd::ste_backward(dy.data(), mask.data(), dx.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      bool keep = (mask[i >> 3] >> (i & 7)) & 1;
      ASSERT_EQ(bits_of(dx[i]), keep ? bits_of(dy[i]) : bits_of(T(0))) << "n " << n << " i " << i;
    }
    EXPECT_EQ(bits_of(dx[n]), 0x1234u) << "wrote past the end, n " << n;
  }
}

TEST(FakeQuantizeSimd, SteBackwardIsABitSelect) {
  check_ste<float>();
  check_ste<double>();
  check_ste<bf16>();
  check_ste<f16>();
}

// ste_backward_exact against dy * 0 computed element by element (the 16-bit types widened to
// f32 and narrowed back): signed zeros, and NaN at every masked-out infinity or NaN, wherever
// the element sits in the SSE blocks. NaN payloads are not compared (x86 and CUDA make
// different ones); that a NaN is there is.
template <typename T>
void check_exact_ste() {
  std::mt19937_64 rng(5);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1001}) {
    std::vector<T> dy(n + 1), dx(n + 1, from_bits<T>(0x1234));
    for (auto& v : dy) v = from_bits<T>(rng());
    // Infinities of both signs among the random bits, which rarely draw one.
    for (int64_t i = 3; i < n; i += 11) dy[i] = T(i % 2 ? INFINITY : -INFINITY);
    std::vector<uint8_t> mask((n + 7) / 8);
    for (auto& m : mask) m = static_cast<uint8_t>(rng());
    fq_simd::ste_backward_exact(dy.data(), mask.data(), dx.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      bool keep = (mask[i >> 3] >> (i & 7)) & 1;
      double d = static_cast<double>(dy[i]);
      if (keep) {
        ASSERT_EQ(bits_of(dx[i]), bits_of(dy[i])) << "n " << n << " i " << i;
      } else if (std::isfinite(d)) {
        ASSERT_EQ(bits_of(dx[i]), bits_of(T(std::signbit(d) ? -0.0f : 0.0f)))
            << "n " << n << " i " << i << " dy " << d;
      } else {
        ASSERT_TRUE(std::isnan(static_cast<double>(dx[i]))) << "n " << n << " i " << i;
      }
    }
    EXPECT_EQ(bits_of(dx[n]), 0x1234u) << "wrote past the end, n " << n;
  }
}

TEST(FakeQuantizeSimd, ExactSteBackwardIsPyTorchsMultiply) {
  check_exact_ste<float>();
  check_exact_ste<double>();
  check_exact_ste<bf16>();
  check_exact_ste<f16>();
}

// The op on hand-checked values: the graph's ste_backward gives +0 where the mask is clear,
// ste_backward_exact gives dy * 0.
TEST(FakeQuantizeSimd, ExactSteOpKeepsTheSignOfZeroAndMakesNaN) {
  Tensor dy = testing::f32({4}, {-2.0, 3.0, -INFINITY, 5.0});
  Tensor mask = Tensor::empty({1}, DType::u8);
  mask.data<uint8_t>()[0] = 0b1000;  // only element 3 passes
  Tensor exact = testing::run_op("ste_backward_exact", {dy, mask})[0];
  Tensor graph = testing::run_op("ste_backward", {dy, mask})[0];
  const float* e = exact.data<float>();
  const float* g = graph.data<float>();
  EXPECT_TRUE(e[0] == 0.0f && std::signbit(e[0]));
  EXPECT_TRUE(e[1] == 0.0f && !std::signbit(e[1]));
  EXPECT_TRUE(std::isnan(e[2]));
  EXPECT_EQ(e[3], 5.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bits_of(g[i]), 0u) << i;
  EXPECT_EQ(g[3], 5.0f);
}

// Bad inputs: each a qg::Error naming the op and the sizes, at graph-build time.
TEST(FakeQuantizeSimd, ExactSteOpRefusesBadMasks) {
  auto message = [](const std::vector<TensorType>& types) {
    try {
      testing::build_op("ste_backward_exact", types);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string wrong_size = message({{DType::f32, {16}}, {DType::u8, {3}}});
  EXPECT_NE(wrong_size.find("[ste_backward_exact]"), std::string::npos) << wrong_size;
  EXPECT_NE(wrong_size.find("mask has 3 bytes"), std::string::npos) << wrong_size;
  EXPECT_NE(wrong_size.find("needs 2"), std::string::npos) << wrong_size;
  std::string wrong_dtype = message({{DType::f32, {16}}, {DType::f32, {2}}});
  EXPECT_NE(wrong_dtype.find("1-D u8 bit mask"), std::string::npos) << wrong_dtype;
  std::string integer_dy = message({{DType::i32, {16}}, {DType::u8, {2}}});
  EXPECT_NE(integer_dy.find("[ste_backward_exact]"), std::string::npos) << integer_dy;
}

// Through the op: every scope, with runs that are long, short, unaligned or per-element,
// against a reference that finds each element's qparams from its own index arithmetic.
struct ScopeCase {
  Shape shape;
  Attrs attrs;
  Shape qshape;
};

int64_t reference_qparam(const ScopeCase& c, int64_t k) {
  const std::string scope = c.attrs.has("scope") ? c.attrs.get_string("scope") : "tensor";
  if (scope == "tensor") return 0;
  int rank = static_cast<int>(c.shape.size());
  int axis = scope == "token" ? rank - 1 : static_cast<int>(c.attrs.get_int("axis"));
  if (axis < 0) axis += rank;
  int64_t inner = 1;
  for (int d = axis + 1; d < rank; ++d) inner *= c.shape[d];
  int64_t len = c.shape[axis];
  int64_t i = k % inner, a = (k / inner) % len, o = k / (inner * len);
  if (scope == "token") return o;
  if (scope == "channel") return a;
  int64_t gs = c.attrs.get_int("group_size"), groups = (len + gs - 1) / gs;
  return (o * groups + a / gs) * inner + i;
}

template <typename T>
void check_scopes(DType dtype) {
  using testing::run_op;
  std::vector<ScopeCase> cases = {
      {{3, 37}, {}, {1}},
      {{5, 13}, {{"scope", "token"}}, {5, 1}},
      {{4, 3, 16}, {{"scope", "token"}}, {4, 3, 1}},
      {{5, 21}, {{"scope", "channel"}, {"axis", 0}}, {5}},
      {{2, 6, 3}, {{"scope", "channel"}, {"axis", 1}}, {6}},
      {{2, 4, 8}, {{"scope", "channel"}, {"axis", 1}}, {4}},
      {{3, 19}, {{"scope", "channel"}, {"axis", -1}}, {19}},
      {{3, 5}, {{"scope", "channel"}, {"axis", -1}}, {5}},
      {{3, 29}, {{"scope", "group"}, {"axis", -1}, {"group_size", 8}}, {3, 4}},
      {{2, 10}, {{"scope", "group"}, {"axis", 1}, {"group_size", 3}}, {2, 4}},
      {{10, 11}, {{"scope", "group"}, {"axis", 0}, {"group_size", 4}}, {3, 11}},
      {{2, 7, 9}, {{"scope", "group"}, {"axis", 1}, {"group_size", 3}}, {2, 3, 9}},
  };
  QP base{0.05f, 0, -128, 127};
  std::vector<T> pool = adversarial<T>(base, 21);
  size_t next = 0;
  for (const ScopeCase& c : cases) {
    Attrs attrs = c.attrs;
    attrs.set("signed", true);
    int64_t n = shape_numel(c.shape), nq = shape_numel(c.qshape);
    std::vector<double> xs(n), ss(nq), zs(nq);
    Tensor x = Tensor::empty(c.shape, dtype);
    for (int64_t k = 0; k < n; ++k) x.data<T>()[k] = pool[next++ % pool.size()];
    for (int64_t q = 0; q < nq; ++q) {
      ss[q] = q % 3 == 2 ? 0.25 : 0.05 * (1 + q % 5);
      zs[q] = static_cast<double>(q % 7) - 3;
    }
    Tensor scale = Tensor::from_doubles(c.qshape, ss, DType::f32);
    Tensor zp = Tensor::from_doubles(c.qshape, zs, DType::i32);
    auto out = run_op("fake_quantize", {x, scale, zp}, attrs);
    const T* y = out[0].data<T>();
    const uint8_t* mask = out[1].data<uint8_t>();
    int bad = 0;
    for (int64_t k = 0; k < n && bad < 5; ++k) {
      int64_t q = reference_qparam(c, k);
      float s = scale.data<float>()[q];
      bool in;
      T want = reference_one(x.data<T>()[k], s, static_cast<float>(zs[q]), -128.0f, 127.0f, &in);
      bool got_in = (mask[k >> 3] >> (k & 7)) & 1;
      if (bits_of(y[k]) != bits_of(want) || got_in != in) {
        ++bad;
        ADD_FAILURE() << dtype_name(dtype) << " " << shape_str(c.shape) << " case #"
                      << (&c - cases.data()) << " element " << k << ": y bits " << std::hex
                      << bits_of(y[k]) << " want " << bits_of(want) << ", mask " << got_in
                      << " want " << in;
      }
    }
    for (int64_t k = n; k < out[1].numel() * 8; ++k)
      EXPECT_EQ((mask[k >> 3] >> (k & 7)) & 1, 0) << "mask bit past the end set";
  }
}

TEST(FakeQuantizeSimd, EveryScopeThroughTheOp) {
  check_scopes<float>(DType::f32);
  check_scopes<bf16>(DType::bf16);
  check_scopes<f16>(DType::f16);
}

}  // namespace
}  // namespace qg
