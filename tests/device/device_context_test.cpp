// The DeviceContext plumbing, on the CPU: every executor owns its own context, its kernels
// receive that context (not another executor's), precision flags are per context, library
// handles are made once per context and destroyed with it, and the environment only sets the
// flags a new context starts with.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/graph.h"
#include "core/op_registry.h"
#include "device/device_context.h"
#include "runtime/executor.h"
#include "runtime/static_run.h"
#include "tests/common/scoped_env.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

// What the probe op's kernel saw on its last call.
const DeviceContext* seen_context = nullptr;
bool seen_tf32 = false;

// y = x, recording the context the kernel was handed.
void define_probe_op() {
  static bool defined = false;
  if (defined) return;
  defined = true;
  OpDef& op = OpRegistry::instance().define("test_context_probe");
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.infer = [](const InferContext& c) { return std::vector<TensorType>{c.inputs[0]}; };
  op.kernels.push_back({DeviceType::cpu, {}, [](KernelContext& ctx) {
                          seen_context = &ctx.device;
                          seen_tf32 = ctx.device.allow_tf32();
                          std::memcpy(ctx.outputs[0].raw_data(), ctx.inputs[0].raw_data(),
                                      ctx.inputs[0].nbytes());
                        }});
}

struct ProbeGraph {
  Graph graph;
  ValueId y = kNoValue;
  ProbeGraph() {
    define_probe_op();
    ValueId x = graph.input("x", {DType::f32, {3}});
    y = graph.apply1("test_context_probe", {x});
  }
};

ContextOptions with_tf32(bool on) {
  ContextOptions o;
  o.precision.allow_tf32 = on;
  return o;
}

using testing::ScopedEnv;

TEST(DeviceContext, CpuContextHasNoStreamNorErrorBuffer) {
  auto ctx = make_device_context(Device::cpu(), with_tf32(true));
  EXPECT_TRUE(ctx->device().is_cpu());
  EXPECT_EQ(ctx->stream(), nullptr);
  EXPECT_EQ(ctx->error_buffer(), nullptr);
  EXPECT_TRUE(ctx->allow_tf32());
  ctx->set_allow_tf32(false);
  EXPECT_FALSE(ctx->precision().allow_tf32);
  // The CPU context's hooks do nothing and raise nothing.
  ctx->make_current();
  ctx->synchronize();
  ctx->check_launch("probe");
  ctx->check_errors(nullptr);
}

TEST(DeviceContext, CopyBetweenHostBuffers) {
  auto ctx = make_device_context(Device::cpu());
  Tensor src = Tensor::from_doubles({4}, {1, 2, 3, 4});
  Tensor dst = Tensor::empty({4}, DType::f32);
  ctx->copy(dst.raw_data(), dst.device(), src.raw_data(), src.device(), src.nbytes());
  EXPECT_EQ(dst.to_doubles(), (std::vector<double>{1, 2, 3, 4}));
}

TEST(DeviceContext, FlagsStartFromTheEnvironment) {
  {
    ScopedEnv env("QG_ALLOW_TF32", "1");
    EXPECT_TRUE(PrecisionFlags::from_environment().allow_tf32);
    EXPECT_TRUE(make_device_context(Device::cpu())->allow_tf32());
    // Explicit flags win over the environment.
    EXPECT_FALSE(make_device_context(Device::cpu(), with_tf32(false))->allow_tf32());
  }
  {
    ScopedEnv env("QG_ALLOW_TF32", "0");
    EXPECT_FALSE(PrecisionFlags::from_environment().allow_tf32);
  }
  {
    ScopedEnv env("QG_ALLOW_TF32", nullptr);
    EXPECT_FALSE(make_device_context(Device::cpu())->allow_tf32());
  }
}

int created = 0, destroyed = 0;

TEST(DeviceContext, LibraryHandlesAreMadeOncePerContextAndDestroyedWithIt) {
  created = destroyed = 0;
  auto create = [](DeviceContext&) -> void* { return new int(++created); };
  auto destroy = [](void* h) {
    ++destroyed;
    delete static_cast<int*>(h);
  };
  void* a1 = nullptr;
  {
    auto a = make_device_context(Device::cpu());
    auto b = make_device_context(Device::cpu());
    a1 = a->library_handle(LibraryHandle::cublas, create, destroy);
    EXPECT_EQ(a->library_handle(LibraryHandle::cublas, create, destroy), a1);
    void* b1 = b->library_handle(LibraryHandle::cublas, create, destroy);
    EXPECT_NE(a1, b1);
    void* a2 = a->library_handle(LibraryHandle::cudnn, create, destroy);
    EXPECT_NE(a1, a2);
    EXPECT_EQ(created, 3);
    EXPECT_EQ(destroyed, 0);
  }
  EXPECT_EQ(destroyed, 3);
}

TEST(DeviceContext, EachExecutorHandsItsOwnContextToItsKernels) {
  ProbeGraph p;
  Executor plain(p.graph, Device::cpu(), with_tf32(false));
  Executor tf32(p.graph, Device::cpu(), with_tf32(true));
  EXPECT_NE(&plain.context(), &tf32.context());
  Executor::Feeds feeds = {{"x", Tensor::from_doubles({3}, {1, 2, 3})}};

  plain.run(feeds, {p.y});
  EXPECT_EQ(seen_context, &plain.context());
  EXPECT_FALSE(seen_tf32);
  tf32.run(feeds, {p.y});
  EXPECT_EQ(seen_context, &tf32.context());
  EXPECT_TRUE(seen_tf32);

  // A flag changed on one executor reaches its later runs and no other executor's.
  plain.context().set_allow_tf32(true);
  tf32.context().set_allow_tf32(false);
  plain.run(feeds, {p.y});
  EXPECT_TRUE(seen_tf32);
  tf32.run(feeds, {p.y});
  EXPECT_FALSE(seen_tf32);
}

TEST(DeviceContext, StaticRunLaunchesWithItsExecutorsContext) {
  ProbeGraph p;
  Executor exec(p.graph, Device::cpu(), with_tf32(true));
  Executor other(p.graph, Device::cpu(), with_tf32(false));
  Executor::Feeds feeds = {{"x", Tensor::from_doubles({3}, {1, 2, 3})}};
  StaticRun run(exec, feeds, {p.y});
  other.run(feeds, {p.y});
  EXPECT_EQ(seen_context, &other.context());
  run.launch();
  EXPECT_EQ(seen_context, &exec.context());
  EXPECT_TRUE(seen_tf32);
  // write_input copies through the executor's context.
  run.write_input("x", Tensor::from_doubles({3}, {4, 5, 6}));
  run.launch();
  EXPECT_EQ(run.value(p.y).to_doubles(), (std::vector<double>{4, 5, 6}));
}

TEST(DeviceContext, CudaContextWithoutADeviceSaysSo) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; this checks the no-GPU path";
  expect_error([] { make_device_context(Device::cuda(0)); }, {"cuda:0"});
}

}  // namespace
}  // namespace qg
