// Two executors on the GPU do not share device state: each has its own stream, its own TF32
// switch and its own error record, an executor can run on a stream its caller owns, and a
// second device (where the machine has one) runs on its own context. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "gpu_test_util.h"
#ifdef QG_WITH_CUDA
#include <cuda_runtime.h>

#include "device/cuda/cuda_context.h"
#endif

namespace qg {
namespace {

using testing::expect_error;
using testing::random_f32;
using testing::relative_error;
using testing::tf32;

// y = a b, one graph for every executor of a test.
struct Matmul {
  Graph graph;
  ValueId y = kNoValue;
  Tensor a = random_f32({96, 512}, 1), b = random_f32({512, 80}, 2);
  Matmul() {
    ValueId va = graph.input("a", {DType::f32, {96, 512}});
    ValueId vb = graph.input("b", {DType::f32, {512, 80}});
    y = graph.apply1("matmul", {va, vb});
  }
  Executor::Feeds feeds(Device d) const { return {{"a", a.to(d)}, {"b", b.to(d)}}; }
  Tensor cpu() {
    Executor e(graph);
    return e.run(feeds(Device::cpu()), {y})[0];
  }
};

TEST(GpuDeviceContext, TwoExecutorsHaveTheirOwnStreams) {
  QG_REQUIRE_GPU();
  Matmul m;
  Executor a(m.graph, Device::cuda()), b(m.graph, Device::cuda());
  EXPECT_NE(a.stream(), nullptr);
  EXPECT_NE(b.stream(), nullptr);
  EXPECT_NE(a.stream(), b.stream());
  EXPECT_NE(a.context().error_buffer(), b.context().error_buffer());
}

TEST(GpuDeviceContext, Tf32OnOneExecutorLeavesTheOtherExact) {
  QG_REQUIRE_GPU();
  Matmul m;
  Tensor want = m.cpu();
  Executor exact(m.graph, Device::cuda(), tf32(false));
  Executor fast(m.graph, Device::cuda(), tf32(true));
  auto feeds = m.feeds(Device::cuda());
  // Interleaved, so that a switch left behind by one executor would show in the other.
  for (int round = 0; round < 2; ++round) {
    double off = relative_error(exact.run(feeds, {m.y})[0].to(Device::cpu()), want);
    double on = relative_error(fast.run(feeds, {m.y})[0].to(Device::cpu()), want);
    EXPECT_LE(off, 1e-5) << "round " << round;
    EXPECT_GT(on, 1e-5) << "round " << round << ": TF32 was not used";
    EXPECT_LE(on, 4.9e-4) << "round " << round;
  }
  // Switching one executor's flag changes its own later runs only.
  exact.context().set_allow_tf32(true);
  fast.context().set_allow_tf32(false);
  EXPECT_GT(relative_error(exact.run(feeds, {m.y})[0].to(Device::cpu()), want), 1e-5);
  EXPECT_LE(relative_error(fast.run(feeds, {m.y})[0].to(Device::cpu()), want), 1e-5);
}

TEST(GpuDeviceContext, DeviceErrorsStayWithTheirExecutor) {
  QG_REQUIRE_GPU();
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2, 3}});
  ValueId s = g.input("scale", {DType::f32, {1}});
  ValueId z = g.input("zp", {DType::i32, {1}});
  ValueId y = g.apply1("fake_quantize", {x, s, z});
  Executor bad(g, Device::cuda()), good(g, Device::cuda());
  Tensor xs = Tensor::from_doubles({2, 3}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6});
  Tensor zp = Tensor::from_vector<int32_t>({1}, {0});
  Executor::Feeds bad_feeds = {{"x", xs}, {"scale", Tensor::from_doubles({1}, {-0.5})}, {"zp", zp}};
  Executor::Feeds good_feeds = {{"x", xs}, {"scale", Tensor::from_doubles({1}, {0.1})}, {"zp", zp}};
  expect_error([&] { bad.run(bad_feeds, {y}); }, {"fake_quantize", "scale[0] = -0.5"});
  EXPECT_NO_THROW(good.run(good_feeds, {y}));
  // A failure recorded by one context's kernels is not raised by the other's check.
  bad.context().make_current();
#ifdef QG_WITH_CUDA
  std::vector<Tensor> states;
  const Node& n = g.node(g.value(y).producer);
  const KernelDef* k = n.op->find_kernel(DeviceType::cuda, {DType::f32});
  ASSERT_NE(k, nullptr);
  std::vector<Tensor> outputs;  // every output the kernel writes (y and its mask)
  for (ValueId out : n.outputs)
    outputs.push_back(
        Tensor::empty(g.value(out).type.shape, g.value(out).type.dtype, Device::cuda()));
  std::shared_ptr<const PreparedArgs> prepared = g.prepare_args(n);
  KernelContext ctx(n.op->name, *prepared, n.attrs,
                    {xs.to(Device::cuda()), Tensor::from_doubles({1}, {-0.5}).to(Device::cuda()),
                     zp.to(Device::cuda())},
                    outputs, states, bad.context());
  ctx.site = n.id;
  k->fn(ctx);
  EXPECT_NO_THROW(good.context().check_errors(&g));
  expect_error([&] { bad.context().check_errors(&g); }, {"fake_quantize", "scale[0] = -0.5"});
  EXPECT_NO_THROW(bad.context().check_errors(&g));  // cleared once raised
#endif
}

#ifdef QG_WITH_CUDA
TEST(GpuDeviceContext, RunsOnAStreamItsCallerOwns) {
  QG_REQUIRE_GPU();
  Matmul m;
  cudaStream_t own = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
  {
    ContextOptions o = tf32(false);
    o.stream = own;
    Executor e(m.graph, Device::cuda(), o);
    EXPECT_EQ(e.stream(), static_cast<void*>(own));
    EXPECT_LE(relative_error(e.run(m.feeds(Device::cuda()), {m.y})[0].to(Device::cpu()), m.cpu()),
              1e-5);
  }
  // The context borrowed the stream: it is still the caller's to use and destroy.
  EXPECT_EQ(cudaStreamSynchronize(own), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(own), cudaSuccess);
}

TEST(GpuDeviceContext, SecondDeviceRunsOnItsOwnContext) {
  QG_REQUIRE_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << "one CUDA device: the second-device case needs two";
  Matmul m;
  Tensor want = m.cpu();
  Executor first(m.graph, Device::cuda(0), tf32(false));
  Executor second(m.graph, Device::cuda(1), tf32(false));
  EXPECT_EQ(second.device(), Device::cuda(1));
  for (int round = 0; round < 2; ++round) {
    Tensor y1 = second.run(m.feeds(Device::cpu()), {m.y})[0];
    EXPECT_EQ(y1.device(), Device::cuda(1));
    Tensor y0 = first.run(m.feeds(Device::cpu()), {m.y})[0];
    EXPECT_EQ(y0.device(), Device::cuda(0));
    EXPECT_LE(relative_error(y1.to(Device::cpu()), want), 1e-5);
    EXPECT_LE(relative_error(y0.to(Device::cpu()), want), 1e-5);
  }
  // Memory of each device comes from that device.
  cudaPointerAttributes attr{};
  Tensor on1 = Tensor::empty({16}, DType::f32, Device::cuda(1));
  ASSERT_EQ(cudaPointerGetAttributes(&attr, on1.raw_data()), cudaSuccess);
  EXPECT_EQ(attr.device, 1);
}
#endif

}  // namespace
}  // namespace qg
