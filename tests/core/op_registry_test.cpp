// The registry's kernel key (the full input dtype signature), its CUDA-coverage self-check
// and the device check wrapped around every CUDA kernel. The checks run on scratch
// registries, so they are exercised in CPU-only builds too.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/graph.h"
#include "device/device_context.h"
#include "runtime/executor.h"
#include "tests/core/test_util.h"

namespace qg {
namespace {

using testing::expect_error;

std::vector<TensorType> like_input0(const InferContext& c) {
  return {c.inputs[0]};
}

// y = x with y[0] set to `tag`: shows which kernel ran.
KernelFn tagging_kernel(double tag) {
  return [tag](KernelContext& ctx) {
    std::vector<double> v = ctx.inputs[0].to_doubles();
    v.at(0) = tag;
    ctx.outputs[0] = Tensor::from_doubles(ctx.outputs[0].shape(), v, ctx.outputs[0].dtype());
  };
}

// "test_pair(x, s)": one kernel per (x, s) dtype combination, and one accepting any s for
// f64 x. Registered once in the process registry (Graph::apply looks ops up there); the
// "test_" prefix keeps it out of the all-ops checks.
const OpDef& pair_op() {
  OpRegistry& registry = OpRegistry::instance();
  if (const OpDef* op = registry.find("test_pair")) return *op;
  OpDef& op = registry.define("test_pair");
  op.inputs = {"x", "s"};
  op.outputs = {"y"};
  op.infer = like_input0;
  op.cpu_only = true;  // so the process registry's self-check still passes
  op.kernels.push_back(
      {DeviceType::cpu, KernelDTypes::for_inputs({{DType::f32}, {DType::f32}}), tagging_kernel(1)});
  op.kernels.push_back(
      {DeviceType::cpu, KernelDTypes::for_inputs({{DType::f32}, {DType::i32}}), tagging_kernel(2)});
  op.kernels.push_back(
      {DeviceType::cpu, KernelDTypes::for_inputs({{DType::f64}, {}}), tagging_kernel(3)});
  return op;
}

double run_pair(DType x_dtype, DType s_dtype) {
  pair_op();
  Graph g;
  ValueId x = g.input("x", {x_dtype, {2}});
  ValueId s = g.input("s", {s_dtype, {1}});
  ValueId y = g.apply1("test_pair", {x, s});
  Executor exec(g);
  return exec
      .run({{"x", Tensor::from_doubles({2}, {5, 6}, x_dtype)},
            {"s", Tensor::from_doubles({1}, {1}, s_dtype)}},
           {y})[0]
      .at(0);
}

TEST(KernelKey, TheWholeInputSignatureSelectsTheKernel) {
  EXPECT_EQ(run_pair(DType::f32, DType::f32), 1);
  EXPECT_EQ(run_pair(DType::f32, DType::i32), 2);  // same input 0, another kernel
  EXPECT_EQ(run_pair(DType::f64, DType::i8), 3);   // an empty set accepts any dtype
  EXPECT_EQ(run_pair(DType::f64, DType::f32), 3);
}

TEST(KernelKey, AnUnsupportedCombinationFailsAtPrepareNamingEveryInput) {
  pair_op();
  Graph g;
  ValueId x = g.input("x", {DType::f32, {2}});
  ValueId s = g.input("s", {DType::i8, {1}});
  g.apply1("test_pair", {x, s});
  // Input 0 alone (f32) has kernels; the pair (f32, i8) has none.
  expect_error([&] { Executor exec(g); },
               {"test_pair", "no cpu kernel for inputs", "(x: f32, s: i8)", "(x: f32, s: i32)",
                "(x: f64, s: any)"});
}

TEST(KernelKey, SignatureMatching) {
  KernelDTypes input0{DType::f32, DType::f16};  // the terse form: input 0 only
  EXPECT_TRUE(input0.accepts({DType::f16, DType::i32, DType::u8}));
  EXPECT_FALSE(input0.accepts({DType::f64}));
  EXPECT_FALSE(input0.accepts({}));  // a source op has no input 0
  EXPECT_TRUE(KernelDTypes{}.accepts({}));
  EXPECT_TRUE(KernelDTypes{}.accepts({DType::boolean, DType::f64}));
  KernelDTypes second = KernelDTypes::for_inputs({{}, {DType::i32}});
  EXPECT_TRUE(second.accepts({DType::bf16, DType::i32}));
  EXPECT_FALSE(second.accepts({DType::bf16, DType::i64}));
  EXPECT_FALSE(second.accepts({DType::bf16}));
  EXPECT_EQ(second.str({"x", "zero_point"}), "(x: any, zero_point: i32)");
  EXPECT_EQ(input0.str({"x"}), "(x: f32|f16)");
  EXPECT_EQ(KernelDTypes{}.str({"x"}), "(any)");
  EXPECT_EQ(signature_str({DType::f32, DType::i64}, {"x"}), "(x: f32, input 1: i64)");

  OpDef op;
  op.kernels.push_back({DeviceType::cpu, {DType::f32}, tagging_kernel(1)});
  op.kernels.push_back({DeviceType::cuda, {DType::f16}, tagging_kernel(2)});
  EXPECT_EQ(op.find_kernel(DeviceType::cpu, {DType::f32}), &op.kernels[0]);
  EXPECT_EQ(op.find_kernel(DeviceType::cpu, {DType::f16}), nullptr);
  EXPECT_EQ(op.find_kernel(DeviceType::cuda, {DType::f16}), &op.kernels[1]);
}

// A scratch registry holding one op with a CPU kernel for f32/f16 x.
OpDef& define_cpu_op(OpRegistry& r, const std::string& name) {
  OpDef& op = r.define(name);
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.infer = like_input0;
  op.kernels.push_back({DeviceType::cpu, {DType::f32, DType::f16}, tagging_kernel(0)});
  return op;
}

TEST(RegistrySelfCheck, AnOpWithoutACudaKernelFailsUnlessDeclaredCpuOnly) {
  OpRegistry r;
  OpDef& op = define_cpu_op(r, "lonely");
  r.self_check(/*require_cuda_kernels=*/false);  // a CPU-only build asks for no CUDA kernel
  expect_error([&] { r.self_check(/*require_cuda_kernels=*/true); },
               {"self-check failed", "lonely", "has a CPU kernel and no CUDA kernel", "cpu_only"});
  op.cpu_only = true;
  r.self_check(true);
  op.kernels.push_back({DeviceType::cuda, {DType::f32, DType::f16}, tagging_kernel(0)});
  expect_error([&] { r.self_check(true); }, {"lonely", "declared cpu_only but has a CUDA kernel"});
  op.cpu_only = false;
  r.self_check(true);
}

TEST(RegistrySelfCheck, CudaKernelsMustAcceptTheCpuDtypes) {
  OpRegistry r;
  OpDef& op = define_cpu_op(r, "narrow");
  op.kernels.push_back({DeviceType::cuda, {DType::f32}, tagging_kernel(0)});
  expect_error([&] { r.self_check(true); },
               {"narrow", "CUDA kernels lack dtypes the CPU kernels accept (x: f16)"});
  EXPECT_EQ(cuda_dtype_gaps(op), "x: f16");
  op.cpu_only_dtypes = {DType::f16};
  r.self_check(true);
  EXPECT_EQ(cuda_dtype_gaps(op), "");
  EXPECT_EQ(cuda_dtype_gaps(op, /*include_declared=*/true), "x: f16");
  // A second CUDA kernel covering the dtype closes the gap too.
  op.cpu_only_dtypes.clear();
  op.kernels.push_back({DeviceType::cuda, {DType::f16}, tagging_kernel(0)});
  r.self_check(true);
  // A CPU kernel accepting any dtype at a position needs a CUDA kernel that does too.
  OpDef& any = r.define("any_input");
  any.inputs = {"x"};
  any.outputs = {"y"};
  any.infer = like_input0;
  any.kernels.push_back({DeviceType::cpu, {}, tagging_kernel(0)});
  any.kernels.push_back({DeviceType::cuda, {DType::f32}, tagging_kernel(0)});
  expect_error([&] { r.self_check(true); }, {"any_input", "x: f64, f16, bf16, i8"});
}

TEST(RegistrySelfCheck, TheProcessRegistryPasses) {
  // Filled and checked on first use (with CUDA coverage in a CUDA build); this must not throw.
  const OpRegistry& r = OpRegistry::instance();
  r.self_check();
#ifdef QG_WITH_CUDA
  for (const OpDef* op : r.all()) {
    if (op->name.rfind("test_", 0) == 0 || op->cpu_only) continue;
    EXPECT_TRUE(std::any_of(op->kernels.begin(), op->kernels.end(), [](const KernelDef& k) {
      return k.device == DeviceType::cuda;
    })) << op->name;
  }
#endif
}

// Kernels read their arguments as the op's parsed struct, never attributes by name: an op that
// declares attributes and has kernels must set parse_args, so its attributes are parsed and
// checked once per call site.
TEST(RegistrySelfCheck, EveryOpWithAttributesAndKernelsParsesItsArguments) {
  std::string missing;
  for (const OpDef* op : OpRegistry::instance().all()) {
    if (op->name.rfind("test_", 0) == 0 || op->attrs.empty() || op->kernels.empty()) continue;
    if (!op->parse_args) missing += " " + op->name;
  }
  EXPECT_EQ(missing, "") << "ops whose kernels would read raw attributes (set parse_args)";
}

TEST(CudaDeviceCheck, WrapsEveryCudaKernelOfNonSourceOps) {
  OpRegistry r;
  OpDef& op = define_cpu_op(r, "wrapped");
  int calls = 0;
  op.kernels.push_back({DeviceType::cuda, {}, [&calls](KernelContext&) { ++calls; }});
  OpDef& source = r.define("source");
  source.outputs = {"value"};
  source.is_source = true;
  source.kernels.push_back({DeviceType::cuda, {}, [&calls](KernelContext&) { ++calls; }});
  r.add_cuda_device_checks();

  PreparedArgs no_args;
  Attrs no_attrs;
  std::vector<Tensor> states;
  Tensor host = Tensor::from_doubles({2}, {1, 2}, DType::f32);
  auto cpu = make_device_context(Device::cpu());
  KernelContext ctx(op.name, no_args, no_attrs, {host}, {host.clone()}, states, *cpu);
  // Host tensors given to a CUDA kernel: a named error before the kernel runs.
  expect_error([&] { op.kernels[1].fn(ctx); },
               {"wrapped", "tensor on the wrong device for this CUDA kernel", "input 'x'"});
  EXPECT_EQ(calls, 0);
  // The CPU kernel and the source op's CUDA kernel are not wrapped.
  op.kernels[0].fn(ctx);
  KernelContext src_ctx(source.name, no_args, no_attrs, {}, {host.clone()}, states, *cpu);
  source.kernels[0].fn(src_ctx);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace qg
