// Bad input on the device: host tensors handed to CUDA kernels, mixed devices in one op, an
// allocation the device cannot satisfy, a launch the device rejects, and the runtime
// validation that kernels record on the device (bad qparams, labels out of range). Each is
// a qg::Error naming the op and the value (and CUDA's own text where CUDA failed).
#include <cstring>

#include "gpu_test_util.h"
#ifdef QG_WITH_CUDA
#include "device/cuda/device_error.h"
#include "device/cuda/launch.h"
#endif

namespace qg {
namespace {

using testing::expect_error;

// Calls the CUDA kernel of the node producing `v` with the given tensors.
void call_cuda_kernel(const Graph& g, ValueId v, std::vector<Tensor> inputs,
                      std::vector<Tensor> outputs) {
  const Node& n = g.node(g.value(v).producer);
  std::vector<Tensor> states;
  const KernelDef* k = n.op->find_kernel(DeviceType::cuda, dtypes_of(inputs));
  ASSERT_NE(k, nullptr);
  auto context = make_device_context(Device::cuda());
  std::shared_ptr<const PreparedArgs> prepared = g.prepare_args(n);
  KernelContext ctx(n.op->name, *prepared, n.attrs, std::move(inputs), std::move(outputs), states,
                    *context);
  ctx.site = n.id;
  k->fn(ctx);
}

TEST(GpuDeviceErrors, HostTensorGivenToCudaKernel) {
  QG_REQUIRE_GPU();
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId y = g.apply1("relu", {x});
  Tensor host = Tensor::from_doubles({4}, {1, -2, 3, -4});
  Tensor out = Tensor::empty({4}, DType::f32, Device::cuda());
  expect_error([&] { call_cuda_kernel(g, y, {host}, {out}); },
               {"relu", "wrong device", "input 'x' f32[4] on cpu"});
}

TEST(GpuDeviceErrors, MixedDevicesInOneOp) {
  QG_REQUIRE_GPU();
  Graph g;
  ValueId a = g.input("a", {DType::f32, {3}});
  ValueId b = g.input("b", {DType::f32, {3}});
  ValueId y = g.apply1("add", {a, b});
  Tensor on_gpu = Tensor::from_doubles({3}, {1, 2, 3}).to(Device::cuda());
  Tensor on_cpu = Tensor::from_doubles({3}, {1, 2, 3});
  Tensor out = Tensor::empty({3}, DType::f32, Device::cuda());
  expect_error(
      [&] {
        call_cuda_kernel(g, y, {on_gpu, on_cpu}, {out});
      },
      {"add", "mixed devices", "cuda:0", "on cpu"});
}

TEST(GpuDeviceErrors, ParameterReplacedByHostTensor) {
  QG_REQUIRE_GPU();
  Graph g;
  ValueId w = g.parameter("w", Tensor::from_doubles({2}, {1, 2}));
  ValueId y = g.apply1("neg", {w});
  Executor exec(g, Device::cuda());
  exec.parameter("w") = Tensor::from_doubles({2}, {1, 2});  // a host tensor sneaks in
  expect_error([&] { exec.run({}, {y}); }, {"parameter", "f32[2] on cpu", "cuda:0"});
}

TEST(GpuDeviceErrors, OutOfMemoryAllocation) {
  QG_REQUIRE_GPU();
  const int64_t pib = int64_t{1} << 50;
  expect_error([&] { Tensor::empty({pib}, DType::u8, Device::cuda()); },
               {"cuda_allocator", "cudaMalloc of 1125899906842624 bytes", "out of memory"});
  // The device stays usable afterwards.
  Tensor t = Tensor::from_doubles({2}, {5, 6}).to(Device::cuda()).to(Device::cpu());
  EXPECT_EQ(t.at(1), 6);
}

#ifdef QG_WITH_CUDA
TEST(GpuDeviceErrors, FailedLaunchCarriesCudaText) {
  QG_REQUIRE_GPU();
  auto context = make_device_context(Device::cuda());
  expect_error([&] { cuda::launch_probe(*context, 4096); },
               {"launch_probe", "cudaGetLastError() failed: cudaError"});
  EXPECT_NO_THROW(cuda::launch_probe(*context, 128));
}
#endif

// qparams fed at run time cannot be checked while the graph is built; the kernel records the
// failure on the device and the run raises it at its end.
TEST(GpuDeviceErrors, BadScaleRaisedAtEndOfRun) {
  QG_REQUIRE_GPU();
  Tensor x = Tensor::from_doubles({2, 3}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6});
  Tensor scale = Tensor::from_doubles({1}, {-0.5});
  Tensor zp = Tensor::from_vector<int32_t>({1}, {0});
  expect_error(
      [&] {
        testing::run_op(Device::cuda(), "fake_quantize", {x, scale, zp});
      },
      {"fake_quantize", "scale[0] = -0.5", "positive and finite"});
  Tensor nan_scale = Tensor::from_doubles({1}, {std::nan("")});
  expect_error(
      [&] {
        testing::run_op(Device::cuda(), "fake_quantize", {x, nan_scale, zp});
      },
      {"fake_quantize", "scale[0] = nan"});
  // The record was consumed: a good run afterwards succeeds.
  Tensor good = Tensor::from_doubles({1}, {0.1});
  EXPECT_NO_THROW(testing::run_op(Device::cuda(), "fake_quantize", {x, good, zp}));
}

TEST(GpuDeviceErrors, ZeroPointOutOfRangeRaised) {
  QG_REQUIRE_GPU();
  Tensor x = Tensor::from_doubles({2, 3}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6});
  Tensor scale = Tensor::from_doubles({3}, {0.1, 0.1, 0.1});
  Tensor zp = Tensor::from_vector<int32_t>({3}, {0, 300, 0});
  expect_error(
      [&] {
        testing::run_op(Device::cuda(), "fake_quantize", {x, scale, zp},
                        {{"scope", "channel"}, {"axis", 1}});
      },
      {"fake_quantize", "zero_point[1] = 300", "[0, 255]"});
}

TEST(GpuDeviceErrors, LabelOutOfRangeRaised) {
  QG_REQUIRE_GPU();
  Tensor logits = Tensor::from_doubles({2, 3}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6});
  Tensor labels = Tensor::from_vector<int64_t>({2}, {0, 3});
  expect_error(
      [&] {
        testing::run_op(Device::cuda(), "softmax_cross_entropy", {logits, labels});
      },
      {"softmax_cross_entropy", "labels[1] = 3", "outside [0, 3)"});
  Tensor negative = Tensor::from_vector<int64_t>({2}, {-1, 0});
  expect_error(
      [&] {
        testing::run_op(Device::cuda(), "softmax_cross_entropy", {logits, negative});
      },
      {"labels[0] = -1"});
}

TEST(GpuDeviceErrors, DeviceErrorsNameTheNode) {
  QG_REQUIRE_GPU();
  Graph g;
  ValueId x = g.input("x", {DType::f32, {4}});
  ValueId s = g.input("s", {DType::f32, {1}});
  ValueId z = g.input("z", {DType::i32, {1}});
  ValueId y = g.apply("fake_quantize", {x, s, z}, {}, "fq_layer1").at(0);
  Executor exec(g, Device::cuda());
  Executor::Feeds feeds{{"x", Tensor::from_doubles({4}, {1, 2, 3, 4})},
                        {"s", Tensor::from_doubles({1}, {0.0})},
                        {"z", Tensor::from_vector<int32_t>({1}, {0})}};
  expect_error([&] { exec.run(feeds, {y}); }, {"fake_quantize", "fq_layer1", "scale[0] = 0"});
}

#ifdef QG_WITH_CUDA
// The records a peer-mailbox wait leaves (ops/common/peer_exchange.cuh): the rank whose
// statistics never came, or (-1) an exchange skipped after an earlier one timed out. No GPU
// is needed to format them; Nccl.StuckRankTimesOutItsPeersObserverExchange makes them happen.
TEST(GpuDeviceErrors, PeerTimeoutsNameTheRankAndTheExchange) {
  cuda::DeviceErrorRecord waited{cuda::kPeerTimeout, 0, 7, 1.0, 0.0, 3.0};
  EXPECT_EQ(cuda::describe_device_error(waited),
            "no statistics from rank 1 for exchange 7 within 3 s (it died, stalled, or stopped "
            "waiting itself); this rank's result is wrong");
  cuda::DeviceErrorRecord skipped{cuda::kPeerTimeout, 0, 9, -1.0, 0.0, 3.0};
  EXPECT_EQ(cuda::describe_device_error(skipped),
            "statistics exchange 9 skipped: an earlier exchange waited 3 s in vain; this rank's "
            "result is wrong");
}
#endif

TEST(GpuDeviceErrors, NoDeviceIsReportedWhenAbsent) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; this checks the no-GPU path";
  expect_error([] { Executor e(Graph{}, Device::cuda()); }, {"cuda"});
}

}  // namespace
}  // namespace qg
