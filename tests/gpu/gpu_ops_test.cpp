// GPU kernels on hand-checked values, determinism of the reductions, device-resident state,
// and indexing past 2^31 elements.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "gpu_test_util.h"
#include "runtime/crosscheck.h"
#ifdef QG_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace qg {
namespace {

using testing::run_op;
using testing::same_bits;

TEST(GpuOps, FakeQuantizeHandValues) {
  QG_REQUIRE_GPU();
  // scale 0.5, zp 2, u8: q = rint(x * 2) + 2. 0.25 -> rint(0.5) = 0 (half to even) -> y 0;
  // 0.75 -> rint(1.5) = 2 -> y 1.0; -1.25 -> rint(-2.5) = -2 -> y -1.0; 200 clamps to 255.
  Tensor x = Tensor::from_doubles({5}, {0.25, 0.75, -1.25, 200, std::nan("")});
  Tensor s = Tensor::from_doubles({1}, {0.5});
  Tensor z = Tensor::from_vector<int32_t>({1}, {2});
  auto out = run_op(Device::cuda(), "fake_quantize", {x, s, z});
  EXPECT_EQ(out[0].at(0), 0.0);
  EXPECT_EQ(out[0].at(1), 1.0);
  EXPECT_EQ(out[0].at(2), -1.0);
  EXPECT_EQ(out[0].at(3), (255 - 2) * 0.5);
  EXPECT_TRUE(std::isnan(out[0].at(4)));
  EXPECT_EQ(out[1].at(0), 0b00111);  // in range: elements 0..2; 200 clamped, NaN out
}

TEST(GpuOps, SteBackwardUsesMaskBits) {
  QG_REQUIRE_GPU();
  Tensor dy = Tensor::from_doubles({10}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  Tensor mask = Tensor::from_vector<uint8_t>({2}, {0b10100101, 0b10});
  auto out = run_op(Device::cuda(), "ste_backward", {dy, mask});
  std::vector<double> want = {1, 0, 3, 0, 0, 6, 0, 8, 0, 10};
  EXPECT_EQ(out[0].to_doubles(), want);
}

TEST(GpuOps, MinMaxObserverStateStaysOnDevice) {
  QG_REQUIRE_GPU();
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  auto outs = g.apply("minmax_observer", {x}, {}, "obs");
  Executor exec(g, Device::cuda());
  exec.run({{"x", Tensor::from_doubles({4}, {-1, 0.5, 2, std::nan("")})}}, outs);
  auto got = exec.run({{"x", Tensor::from_doubles({4}, {0, 3, 1, 1})}}, outs);
  NodeId obs = g.value(outs[0]).producer;
  for (const Tensor& st : exec.states(obs)) EXPECT_TRUE(st.device().is_cuda()) << st.str();
  EXPECT_EQ(exec.state(obs, "min").to_doubles()[0], -1.0);
  EXPECT_EQ(exec.state(obs, "max").to_doubles()[0], 3.0);
  EXPECT_EQ(exec.state(obs, "nonfinite_count").to_doubles()[0], 1.0);
  // PyTorch affine u8: scale = (3 - -1) / 255, zp = 0 - rint(-1 / scale) = 64.
  float scale = 4.0f / 255.0f;
  EXPECT_EQ(got[0].to(Device::cpu()).at(0), static_cast<double>(scale));
  EXPECT_EQ(got[1].to(Device::cpu()).at(0), 64.0);
  // observer_enabled = 0 on the device freezes the statistics without a host round trip.
  exec.state(obs, "observer_enabled") = Tensor::from_vector<uint8_t>({1}, {0}).to(Device::cuda());
  exec.run({{"x", Tensor::from_doubles({4}, {-50, 50, 0, 0})}}, outs);
  EXPECT_EQ(exec.state(obs, "max").to_doubles()[0], 3.0);
}

TEST(GpuOps, MatmulHandValues) {
  QG_REQUIRE_GPU();
  Tensor a = Tensor::from_doubles({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from_doubles({3, 2}, {7, 8, 9, 10, 11, 12});
  auto out = run_op(Device::cuda(), "matmul", {a, b});
  EXPECT_EQ(out[0].to_doubles(), (std::vector<double>{58, 64, 139, 154}));
  auto tt =
      run_op(Device::cuda(), "matmul", {b, a}, {{"transpose_a", true}, {"transpose_b", true}});
  EXPECT_EQ(tt[0].to_doubles(), (std::vector<double>{58, 139, 64, 154}));
  for (DType d : {DType::f64, DType::f16, DType::bf16}) {
    auto o = run_op(Device::cuda(), "matmul", {a.cast(d), b.cast(d)});
    EXPECT_EQ(o[0].to_doubles(), (std::vector<double>{58, 64, 139, 154})) << dtype_name(d);
  }
}

TEST(GpuOps, ReductionsAreDeterministic) {
  QG_REQUIRE_GPU();
  std::vector<double> v(3000017);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.001 * i) * 1e3 + 1e-3 * (i % 7);
  Tensor x = Tensor::from_doubles({static_cast<int64_t>(v.size())}, v);
  auto a = run_op(Device::cuda(), "sum", {x});
  auto b = run_op(Device::cuda(), "sum", {x});
  EXPECT_TRUE(same_bits(a[0], b[0]));
  auto c = run_op(Device::cpu(), "sum", {x});
  EXPECT_NEAR(a[0].at(0), c[0].at(0), 1e-5 * std::abs(c[0].at(0)) + 1e-3);
  auto m1 = run_op(Device::cuda(), "minmax_observer", {x});
  auto m2 = run_op(Device::cuda(), "minmax_observer", {x});
  EXPECT_TRUE(same_bits(m1[0], m2[0]));
  EXPECT_TRUE(same_bits(m1[1], m2[1]));
}

TEST(GpuOps, HalfTypesRoundLikeTheCpu) {
  QG_REQUIRE_GPU();
  Tensor a = Tensor::from_doubles({7}, {1.0009765625, 3.14159, -2.5e-5, 65504, 1e-8, 0.1, -0.0});
  for (DType d : {DType::f16, DType::bf16}) {
    Tensor ad = a.cast(d), bd = Tensor::from_doubles({7}, {0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3}, d);
    for (const char* op : {"add", "mul", "sub"}) {
      auto gpu = run_op(Device::cuda(), op, {ad, bd});
      auto cpu = run_op(Device::cpu(), op, {ad, bd});
      EXPECT_TRUE(same_bits(gpu[0], cpu[0])) << op << " " << dtype_name(d);
    }
  }
}

#ifdef QG_WITH_CUDA
// A bounded case past 2^31 elements: fake_quantize on f16 (8.6 GB of device memory). The
// data is set on the device (memset of a byte pattern) so the host never holds it.
TEST(GpuOps, IndexingPast2To31Elements) {
  QG_REQUIRE_GPU();
  const int64_t n = (int64_t{1} << 31) + 37;
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  if (free_bytes < static_cast<size_t>(n) * 4 + (size_t{1} << 30))
    GTEST_SKIP() << "needs ~" << (n * 4 >> 30) << " GiB of free device memory";
  Graph g;
  ValueId x = g.input("x", {DType::f16, {n}});
  ValueId s = g.constant(Tensor::from_doubles({1}, {0.5}));
  ValueId z = g.constant(Tensor::from_vector<int32_t>({1}, {0}));
  auto outs = g.apply("fake_quantize", {x, s, z}, {{"signed", true}});
  Tensor xd = Tensor::empty({n}, DType::f16, Device::cuda());
  // 0x3C3C as f16 is 1.05859375 -> rint(2.1171875) = 2 -> y = 1.0 in range.
  ASSERT_EQ(cudaMemset(xd.raw_data(), 0x3C, xd.nbytes()), cudaSuccess);
  // Element 2^31 + 5 = 100.0 (0x5640) -> clamps to 127 * 0.5, out of range.
  const int64_t far = (int64_t{1} << 31) + 5;
  uint16_t big = 0x5640;
  ASSERT_EQ(
      cudaMemcpy(static_cast<uint16_t*>(xd.raw_data()) + far, &big, 2, cudaMemcpyHostToDevice),
      cudaSuccess);
  Executor exec(g, Device::cuda());
  auto got = exec.run({{"x", xd}}, outs);
  auto read_y = [&](int64_t i) {
    uint16_t h = 0;
    EXPECT_EQ(cudaMemcpy(&h, static_cast<const uint16_t*>(got[0].raw_data()) + i, 2,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  };
  auto read_mask = [&](int64_t byte) {
    uint8_t m = 0;
    EXPECT_EQ(cudaMemcpy(&m, static_cast<const uint8_t*>(got[1].raw_data()) + byte, 1,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return m;
  };
  EXPECT_EQ(read_y(0), 0x3C00);      // 1.0
  EXPECT_EQ(read_y(n - 1), 0x3C00);  // the last element, past 2^31
  EXPECT_EQ(read_y(far), 0x53F0);    // 63.5
  EXPECT_EQ(read_mask(far / 8), 0xFF & ~(1u << (far % 8)));
  EXPECT_EQ(read_mask((n - 1) / 8), (1u << (n % 8)) - 1u);  // only real elements set
}
#endif

}  // namespace
}  // namespace qg
