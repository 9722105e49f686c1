// cast: hand-checked roundings (ties to even, overflow to infinity, subnormals, f64 through
// f32), NaN and infinities kept, same-dtype casts copying bits, the gradient cast back to the
// input dtype, the gradient check, bad inputs, torch's bf16 conversion as the oracle (Debian's
// python3-torch; f16/f32/f64 are in tests/conformance/cast_conformance.py, since .npy has no
// bf16), and the GPU against the CPU bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "autograd/grad.h"
#include "core/npy.h"
#include "runtime/gradcheck.h"
#include "tests/gpu/gpu_test_util.h"

namespace qg {
namespace {

using testing::expect_error;
using testing::run_op;
using testing::same_bits;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

Tensor cast(const Tensor& x, const char* dtype, Device device = Device::cpu()) {
  return run_op(device, "cast", {x}, {{"dtype", dtype}})[0];
}

std::vector<uint16_t> bits16(const Tensor& t) {
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.raw_data(), t.nbytes());
  return v;
}

bool is_nan16(uint16_t b, DType d) {
  return d == DType::bf16 ? (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0
                          : (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0;
}

TEST(Cast, F32ToBf16RoundsToNearestEven) {
  const double u = std::ldexp(1.0, -8);  // half a bf16 ulp at 1
  Tensor x = Tensor::from_doubles(
      {12},
      {1.0, 1 + u, 1 + 3 * u, 1 + u + std::ldexp(1.0, -20), -1 - u,
       std::numeric_limits<float>::max(), kInf, -kInf, kNaN, std::ldexp(1.0, -149), -0.0, 3.140625},
      DType::f32);
  Tensor y = cast(x, "bf16");
  ASSERT_EQ(y.dtype(), DType::bf16);
  std::vector<uint16_t> b = bits16(y);
  EXPECT_EQ(b[0], 0x3f80);
  EXPECT_EQ(b[1], 0x3f80);  // a tie: to the even 1.0
  EXPECT_EQ(b[2], 0x3f82);  // a tie: to the even 1 + 2^-6, not 1 + 2^-7
  EXPECT_EQ(b[3], 0x3f81);  // just above the tie: up
  EXPECT_EQ(b[4], 0xbf80);
  EXPECT_EQ(b[5], 0x7f80);  // f32's max rounds past bf16's max: +inf
  EXPECT_EQ(b[6], 0x7f80);
  EXPECT_EQ(b[7], 0xff80);
  EXPECT_TRUE(is_nan16(b[8], DType::bf16));
  EXPECT_EQ(b[9], 0x0000);  // f32's smallest subnormal is below bf16's: 0
  EXPECT_EQ(b[10], 0x8000);
  EXPECT_EQ(b[11], 0x4049);  // exactly representable
}

TEST(Cast, F32ToF16RoundsToNearestEven) {
  const double s = std::ldexp(1.0, -24);  // f16's smallest subnormal
  Tensor x = Tensor::from_doubles(
      {8}, {65504, 65519, 65520, s, s / 2, 3 * s / 2, 1 + std::ldexp(1.0, -11), -kInf}, DType::f32);
  std::vector<uint16_t> b = bits16(cast(x, "f16"));
  EXPECT_EQ(b[0], 0x7bff);  // f16's max
  EXPECT_EQ(b[1], 0x7bff);  // below the tie with 65536
  EXPECT_EQ(b[2], 0x7c00);  // the tie rounds to even: +inf
  EXPECT_EQ(b[3], 0x0001);
  EXPECT_EQ(b[4], 0x0000);  // a tie: to the even 0
  EXPECT_EQ(b[5], 0x0002);  // a tie: to the even 2^-23
  EXPECT_EQ(b[6], 0x3c00);  // a tie: to the even 1.0
  EXPECT_EQ(b[7], 0xfc00);
}

TEST(Cast, F64ToHalvesRoundsThroughF32) {
  // 1 + 2^-8 + 2^-30 lies above the bf16 tie, but its f32 rounding is the tie itself, which
  // then goes to the even 1.0: torch's double -> bfloat16 (tested below) gives the same.
  Tensor x =
      Tensor::from_doubles({2}, {1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), -2.5}, DType::f64);
  EXPECT_EQ(bits16(cast(x, "bf16")), (std::vector<uint16_t>{0x3f80, 0xc020}));
  Tensor h =
      Tensor::from_doubles({1}, {1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)}, DType::f64);
  EXPECT_EQ(bits16(cast(h, "f16")), (std::vector<uint16_t>{0x3c00}));
  // f64 -> f32 rounds once, to nearest even.
  Tensor f = cast(Tensor::from_doubles({2}, {1 + std::ldexp(1.0, -24), 0.1}, DType::f64), "f32");
  EXPECT_EQ(f.to_doubles(), (std::vector<double>{1.0, static_cast<double>(0.1f)}));
}

TEST(Cast, WideningIsExactAndKeepsSpecials) {
  const std::vector<double> v = {0.5, -3.140625, 65504, kInf, -kInf, kNaN, -0.0};
  for (DType from : {DType::f16, DType::bf16, DType::f32}) {
    Tensor x = Tensor::from_doubles({7}, v, from);
    for (const char* to : {"f32", "f64"}) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + to);
      std::vector<double> want = x.to_doubles(), got = cast(x, to).to_doubles();
      for (size_t i = 0; i < v.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i]));
        } else {
          EXPECT_EQ(got[i], want[i]);
          EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i]));
        }
      }
    }
  }
  // f16 -> bf16 goes through the exact f32 value: 1 + 2^-10 rounds to 1.0 in bf16.
  Tensor h = Tensor::from_doubles({2}, {1 + std::ldexp(1.0, -10), 1.5}, DType::f16);
  EXPECT_EQ(bits16(cast(h, "bf16")), (std::vector<uint16_t>{0x3f80, 0x3fc0}));
}

TEST(Cast, SameDtypeCopiesTheBits) {
  Tensor x = Tensor::empty({2}, DType::f32);
  const uint32_t raw[2] = {0x7fa00001u, 0xffc01234u};  // a signalling and a negative NaN
  std::memcpy(x.raw_data(), raw, sizeof raw);
  EXPECT_TRUE(same_bits(cast(x, "f32"), x));
}

TEST(Cast, GradientIsCastBackToTheInputDtype) {
  // loss = sum(cast(x, bf16) * w): dx = cast(w, f32), exact since every w is a bf16 value.
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId w = g.input("w", {DType::bf16, {4}});
  ValueId y = g.apply1("cast", {x}, {{"dtype", "bf16"}});
  ValueId loss = g.apply1("sum", {g.apply1("mul", {y, w})});
  std::vector<ValueId> dx = grad(g, loss, {x});
  ASSERT_EQ(g.value(dx[0]).type.dtype, DType::f32);
  EXPECT_EQ(g.node(g.value(dx[0]).producer).op->name, "cast");
  Executor exec(g);
  auto out = exec.run({{"x", Tensor::from_doubles({4}, {1, 2, 3, 4}, DType::f32)},
                       {"w", Tensor::from_doubles({4}, {0.5, -1.25, 3.0, 1e-3}, DType::bf16)}},
                      dx);
  Tensor want = Tensor::from_doubles({4}, {0.5, -1.25, 3.0, 1e-3}, DType::bf16);
  EXPECT_EQ(out[0].dtype(), DType::f32);
  EXPECT_EQ(out[0].to_doubles(), want.to_doubles());
}

TEST(Cast, PassesTheGradientCheckAndIsListedWithEveryOp) {
  const OpDef& op = OpRegistry::instance().get("cast");
  ASSERT_TRUE(op.is_differentiable());
  for (const GradcheckSample& s : op.gradcheck_samples()) {
    GradcheckResult r = gradcheck(op, s);
    EXPECT_TRUE(r.passed) << s.label << " " << r.error << " " << r.max_rel_error;
  }
  int listed = 0;
  for (const GradcheckResult& r : gradcheck_all()) listed += r.op == "cast" ? 1 : 0;
  EXPECT_GT(listed, 0);  // `qat gradcheck` runs gradcheck_all()
}

TEST(Cast, BadInputsAreNamedErrors) {
  Graph g;
  ValueId x = g.input("x", {DType::f32, {3}});
  ValueId i = g.input("i", {DType::i32, {3}});
  expect_error(
      [&] {
        g.apply("cast", {x}, {{"dtype", "f8"}});
      },
      {"[cast]", "attribute 'dtype' = \"f8\" is not one of: f32, f64, f16, bf16"});
  expect_error([&] { g.apply("cast", {x}, {{"dtype", "i32"}}); }, {"[cast]", "\"i32\""});
  expect_error([&] { g.apply("cast", {x}); }, {"[cast]", "required attribute 'dtype'"});
  expect_error(
      [&] {
        g.apply("cast", {i}, {{"dtype", "f32"}});
      },
      {"[cast]", "must be floating point", "i32[3]"});
  expect_error([&] { g.apply("cast", {x}, {{"dtype", 16}}); }, {"[cast]", "'dtype'", "string"});
}

// Values where conversions first disagree: ties at several magnitudes, subnormals of every
// target, overflow, signed zeros, infinities and NaN.
std::vector<double> edge_values() {
  std::vector<double> v = {0.0, -0.0, kInf, -kInf, kNaN, 65504, 65520, 1e30, -1e30, 3.4e38};
  for (int e : {-149, -133, -126, -25, -24, -14, 0, 7, 15, 100}) {
    const double p = std::ldexp(1.0, e);
    for (double m : {1.0, 1 + std::ldexp(1.0, -8), 1 + 3 * std::ldexp(1.0, -8),
                     1 + std::ldexp(1.0, -11), 1 + 3 * std::ldexp(1.0, -11), 1.75})
      for (double sign : {1.0, -1.0}) v.push_back(sign * m * p);
  }
  for (int k = 0; k < 200; ++k) v.push_back(std::sin(k * 0.731) * std::ldexp(1.0, k % 40 - 20));
  return v;
}

std::string temp_dir() {
  std::string pattern = ::testing::TempDir() + "qg_cast_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  return mkdtemp(buf.data()) ? std::string(buf.data()) : std::string();
}

bool torch_available() {
  return std::system("/usr/bin/python3 -c 'import numpy, torch' >/dev/null 2>&1") == 0;
}

TEST(CastTorch, Bf16BitsMatchTorch) {
  if (!torch_available()) GTEST_SKIP() << "/usr/bin/python3 with numpy and torch is not installed";
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::vector<double> v = edge_values();
  const int64_t n = static_cast<int64_t>(v.size());
  for (DType from : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(from));
    Tensor x = Tensor::from_doubles({n}, v, from);
    const std::string in = dir + "/x.npy", out = dir + "/bits.npy";
    save_npy(in, x);
    // torch's x.to(bfloat16), its bits widened to int32 (.npy has no bf16 or uint16 here).
    const std::string script =
        "import sys, numpy as np, torch; "
        "b = torch.from_numpy(np.load(sys.argv[1])).to(torch.bfloat16).view(torch.int16); "
        "np.save(sys.argv[2], b.numpy().astype(np.int32) & 0xffff)";
    ASSERT_EQ(std::system(("/usr/bin/python3 -c '" + script + "' " + in + " " + out).c_str()), 0);
    std::vector<double> want = load_npy(out).to_doubles();
    std::vector<uint16_t> got = bits16(cast(x, "bf16"));
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t w = static_cast<uint16_t>(want[i]);
      // torch writes every NaN as +0x7fc0; ours keeps the sign (as Eigen and CUDA do).
      const bool same = is_nan16(w, DType::bf16) ? is_nan16(got[i], DType::bf16) : got[i] == w;
      if (!same && ++mismatches < 5)
        ADD_FAILURE() << "x[" << i << "] = " << v[i] << ": ours 0x" << std::hex << got[i]
                      << ", torch 0x" << w;
    }
    EXPECT_EQ(mismatches, 0);
  }
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST(CastGpu, BitIdenticalToTheCpu) {
  QG_REQUIRE_GPU();
  const std::vector<double> v = edge_values();
  const int64_t n = static_cast<int64_t>(v.size());
  for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Tensor x = Tensor::from_doubles({n}, v, from);
    for (const char* to : {"f32", "f64", "f16", "bf16"}) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + to);
      Tensor cpu = cast(x, to, Device::cpu()), gpu = cast(x, to, Device::cuda());
      ASSERT_EQ(cpu.dtype(), gpu.dtype());
      std::vector<double> a = cpu.to_doubles(), b = gpu.to_doubles();
      int mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        // NaN payloads of a narrowing differ between x86 and CUDA; NaN must meet NaN.
        const bool same = std::isnan(a[i])
                              ? std::isnan(b[i])
                              : a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]);
        mismatches += same ? 0 : 1;
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

// The GPU's contiguous cast runs in packs of 8 elements: a length with a partial last pack,
// many blocks, and an input that starts off a 16-byte boundary (element loads instead of
// whole-pack ones) must all match the CPU bit for bit.
TEST(CastGpu, PacksTailsAndUnalignedInputsMatchTheCpu) {
  QG_REQUIRE_GPU();
  const int64_t n = 100003;  // 12500 packs and a tail of 3
  Tensor values = testing::random_f32({n + 1}, 11);
  for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor host = cast(values, dtype_name(from));
    const Tensor device = host.to(Device::cuda());
    const int64_t one = static_cast<int64_t>(dtype_size(from));
    for (const char* to : {"f32", "f64", "f16", "bf16"}) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + to);
      for (int64_t offset : {int64_t{0}, int64_t{1}}) {  // 1: not 16-byte aligned
        const Shape shape{n};
        const Tensor x_cpu = host.view(offset * one, shape, from).clone();
        const Tensor x_gpu = device.view(offset * one, shape, from);
        const Tensor want = cast(x_cpu, to);
        const Tensor got = cast(x_gpu, to, Device::cuda());
        ASSERT_EQ(got.numel(), n);
        EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0)
            << "offset " << offset;
      }
    }
  }
}

}  // namespace
}  // namespace qg
