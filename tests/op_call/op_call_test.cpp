// Kernels called directly (runtime/op_call.h): no graph, no executor. Every op with gradient
// check samples gives, called directly, the bits a one-node graph gives through the executor;
// arguments are parsed once per call site; and every misuse is a named error.
#include <gtest/gtest.h>

#include <random>

#include "core/graph.h"
#include "core/op_registry.h"
#include "runtime/executor.h"
#include "runtime/op_call.h"
#include "tests/common/draw_input.h"
#include "tests/common/tensor_compare.h"
#include "tests/core/test_util.h"

namespace qg {

void define_graph_io_ops(OpRegistry& r);  // ops/graph_io: input, parameter, constant

namespace {

using testing::draw_input;
using testing::expect_error;
using testing::first_difference;

// The op on `inputs` through a one-node graph and the executor: outputs, then states.
std::vector<Tensor> through_executor(const OpDef& op, const std::vector<Tensor>& inputs,
                                     const Attrs& attrs, bool training) {
  Graph g;
  std::vector<ValueId> in;
  Executor::Feeds feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string name = "in" + std::to_string(i);
    in.push_back(g.input(name, {inputs[i].dtype(), inputs[i].shape()}));
    feeds[name] = inputs[i];
  }
  std::vector<ValueId> out = g.apply(op.name, in, attrs);
  NodeId node = g.value(out[0]).producer;
  Executor exec(g);
  exec.set_training(training);
  std::vector<Tensor> got = exec.run(feeds, out, {node});
  for (const Tensor& s : exec.states(node)) got.push_back(s.clone());
  return got;
}

TEST(OpCall, EveryOpDirectlyEqualsTheExecutorBitForBit) {
  auto cpu = make_device_context(Device::cpu());
  std::mt19937_64 rng(7);
  int compared = 0;
  for (const OpDef* def : OpRegistry::instance().all()) {
    const OpDef& op = *def;
    const std::string& name = op.name;
    if (op.is_source || !op.gradcheck_samples || op.side_effects) continue;
    for (const GradcheckSample& s : op.gradcheck_samples()) {
      std::vector<Tensor> inputs;
      for (const GradcheckInput& spec : s.inputs) inputs.push_back(draw_input(spec, rng));
      for (bool training : {true, false}) {
        SCOPED_TRACE(name + " / " + s.label + (training ? " / train" : " / eval"));
        std::vector<Tensor> want = through_executor(op, inputs, s.attrs, training);
        std::vector<Tensor> states;
        std::vector<TensorType> types;
        for (const Tensor& t : inputs) types.push_back({t.dtype(), t.shape()});
        PreparedOp prepared(name, s.attrs, types, DeviceType::cpu);
        states = prepared.initial_states(Device::cpu());
        std::vector<Tensor> got = prepared.run(*cpu, inputs, states, training);
        for (const Tensor& st : states) got.push_back(st);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
          EXPECT_EQ(first_difference(got[i], want[i]), "") << "output/state " << i;
        ++compared;
      }
    }
  }
  // Every differentiable op family has samples; far fewer would mean the loop skipped ops.
  EXPECT_GT(compared, 100);
}

// A test op whose parser counts its calls, with a kernel that reads the parsed struct.
struct ScaleArgs : KernelArgs {
  double factor = 1;
};

OpRegistry counting_registry(int& parses) {
  OpRegistry r;
  define_graph_io_ops(r);  // graphs over this registry need their inputs
  OpDef& op = r.define("scale_by");
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {AttrSpec{"factor", AttrType::real, Attr(2.0), "multiplier", false, nullptr}};
  op.infer = [](const InferContext& c) { return std::vector<TensorType>{c.inputs[0]}; };
  op.parse_args = [&parses](const ArgsSource& s) -> std::shared_ptr<const KernelArgs> {
    ++parses;
    auto a = std::make_shared<ScaleArgs>();
    a->factor = s.attrs.get_real("factor");
    QG_CHECK(a->factor != 0, s.op, "attribute 'factor' must not be 0");
    return a;
  };
  op.kernels.push_back({DeviceType::cpu, {DType::f64}, [](KernelContext& ctx) {
                          const double f = ctx.args<ScaleArgs>().factor;
                          const double* x = ctx.inputs[0].data<double>();
                          double* y = ctx.outputs[0].data<double>();
                          for (int64_t i = 0; i < ctx.inputs[0].numel(); ++i) y[i] = f * x[i];
                        }});
  return r;
}

TEST(OpCall, ArgumentsAreParsedOncePerCallSite) {
  int parses = 0;
  OpRegistry r = counting_registry(parses);
  auto cpu = make_device_context(Device::cpu());
  PreparedOp op("scale_by", {{"factor", 3.0}}, {{DType::f64, {3}}}, DeviceType::cpu, r);
  EXPECT_EQ(parses, 1);
  std::vector<Tensor> none;
  Tensor x = Tensor::from_doubles({3}, {1, 2, 3}, DType::f64);
  for (int i = 0; i < 4; ++i) {
    Tensor y = op.run(*cpu, {x}, none)[0];
    EXPECT_EQ(y.to_doubles(), (std::vector<double>{3, 6, 9}));
  }
  EXPECT_EQ(parses, 1);

  // An executor parses each node once, when it prepares the graph, not per run.
  Graph g(r);
  ValueId in = g.input("x", {DType::f64, {3}});
  ValueId y = g.apply1("scale_by", {in}, {{"factor", 0.5}});
  Executor exec(g);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(exec.run({{"x", x}}, {y})[0].to_doubles(), (std::vector<double>{0.5, 1, 1.5}));
  EXPECT_EQ(parses, 2);

  // The parser's own checks run at preparation, before any tensor is touched.
  expect_error(
      [&] {
        PreparedOp("scale_by", {{"factor", 0.0}}, {{DType::f64, {3}}}, DeviceType::cpu, r);
      },
      {"scale_by", "'factor' must not be 0"});
}

// A kernel that reads its attribute by name, as kernels did before parsers.
OpDef& define_raw_reader(OpRegistry& r) {
  OpDef& op = r.define("raw_reader");
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {AttrSpec{"factor", AttrType::real, Attr(2.0), "multiplier", false, nullptr}};
  op.infer = [](const InferContext& c) { return std::vector<TensorType>{c.inputs[0]}; };
  op.kernels.push_back({DeviceType::cpu, {DType::f64}, [](KernelContext& ctx) {
                          const double f = ctx.attrs.get_real("factor");
                          const double* x = ctx.inputs[0].data<double>();
                          double* y = ctx.outputs[0].data<double>();
                          for (int64_t i = 0; i < ctx.inputs[0].numel(); ++i) y[i] = f * x[i];
                        }});
  return op;
}

TEST(OpCall, KernelsOfAnOpWithAParserSeeNoAttributesByName) {
  OpRegistry r;
  OpDef& op = define_raw_reader(r);
  auto cpu = make_device_context(Device::cpu());
  std::vector<Tensor> none;
  Tensor x = Tensor::from_doubles({2}, {1, 2}, DType::f64);
  PreparedOp unparsed("raw_reader", {{"factor", 3.0}}, {{DType::f64, {2}}}, DeviceType::cpu, r);
  EXPECT_EQ(unparsed.run(*cpu, {x}, none)[0].to_doubles(), (std::vector<double>{3, 6}));
  // Once the op parses its arguments, its kernels read the struct: a read by name fails.
  op.parse_args = no_kernel_args;
  PreparedOp parsed("raw_reader", {{"factor", 3.0}}, {{DType::f64, {2}}}, DeviceType::cpu, r);
  expect_error([&] { parsed.run(*cpu, {x}, none); }, {"attribute 'factor' is not set"});
}

TEST(OpCall, AFusedKernelReadsItsPartsParsedArguments) {
  int parses = 0;
  OpRegistry r = counting_registry(parses);
  KernelPart part{&r.get("scale_by"),
                  {},
                  {},
                  prepare_args(r.get("scale_by"), {{"factor", 4.0}}, {{DType::f64, {3}}}),
                  0};
  EXPECT_EQ(part.args<ScaleArgs>().factor, 4.0);
  struct OtherArgs : KernelArgs {};
  expect_error([&] { part.args<OtherArgs>(); },
               {"scale_by", "arguments its part's parser did not produce"});
}

TEST(OpCall, OutputsGoIntoTheCallersTensors) {
  auto cpu = make_device_context(Device::cpu());
  PreparedOp op("relu", {}, {{DType::f32, {4}}}, DeviceType::cpu);
  std::vector<Tensor> none;
  Tensor out = Tensor::zeros({4}, DType::f32);
  Tensor x = Tensor::from_doubles({4}, {-1, 2, -3, 4});
  std::vector<Tensor> got = op.run(*cpu, {x}, none, true, {out});
  EXPECT_EQ(got[0].raw_data(), out.raw_data());
  EXPECT_EQ(out.to_doubles(), (std::vector<double>{0, 2, 0, 4}));
}

TEST(OpCall, StatefulOpsUpdateTheCallersStates) {
  auto cpu = make_device_context(Device::cpu());
  PreparedOp obs("minmax_observer", {}, {{DType::f32, {4}}}, DeviceType::cpu);
  std::vector<Tensor> states = obs.initial_states(Device::cpu());
  ASSERT_FALSE(states.empty());
  obs.run(*cpu, {Tensor::from_doubles({4}, {-1, 0, 1, 2})}, states);
  std::vector<Tensor> qp = obs.run(*cpu, {Tensor::from_doubles({4}, {-3, 0, 1, 1})}, states);
  // The range covers both batches: [-3, 2] over 255 steps (affine uint8).
  EXPECT_FLOAT_EQ(static_cast<float>(qp[0].at(0)), 5.0f / 255.0f);
}

TEST(OpCall, MisuseIsANamedError) {
  auto cpu = make_device_context(Device::cpu());
  std::vector<Tensor> none;
  Tensor x = Tensor::from_doubles({2, 3}, {1, 2, 3, 4, 5, 6});
  PreparedOp relu("relu", {}, {{DType::f32, {2, 3}}}, DeviceType::cpu);
  expect_error(
      [&] {
        relu.run(*cpu, {Tensor::zeros({3, 2}, DType::f32)}, none);
      },
      {"relu", "input 0 ('x')", "f32[3, 2]", "prepared for f32[2, 3]"});
  expect_error(
      [&] {
        relu.run(*cpu, {Tensor::zeros({2, 3}, DType::f64)}, none);
      },
      {"relu", "f64[2, 3]"});
  expect_error([&] { relu.run(*cpu, {}, none); }, {"relu", "expects 1 inputs, got 0"});
  expect_error([&] { relu.run(*cpu, {Tensor()}, none); }, {"relu", "undefined"});
  expect_error([&] { relu.run(*cpu, {x}, none, true, {Tensor::zeros({2}, DType::f32)}); },
               {"relu", "output 0 ('y')"});
  // A transposed view: this kernel reads memory in order, so it is refused, not misread.
  Tensor t = x.as_strided({3, 2}, {1, 3});
  PreparedOp relu_t("relu", {}, {{DType::f32, {3, 2}}}, DeviceType::cpu);
  expect_error([&] { relu_t.run(*cpu, {t}, none); },
               {"relu", "input 0 ('x') is strided", "needs a contiguous tensor"});
  expect_error([&] { PreparedOp("relu", {}, {}, DeviceType::cpu); },
               {"relu", "expects 1 inputs", "got 0"});
  expect_error([&] { PreparedOp("input", {}, {}, DeviceType::cpu); }, {"input", "graph source op"});
  expect_error([&] { PreparedOp("no_such_op", {}, {}, DeviceType::cpu); }, {"no_such_op"});
  expect_error(
      [&] {
        PreparedOp("fake_quantize", {{"bits", int64_t{40}}},
                   {{DType::f32, {4}}, {DType::f32, {1}}, {DType::i32, {1}}}, DeviceType::cpu);
      },
      {"fake_quantize", "bits"});
  PreparedOp obs("minmax_observer", {}, {{DType::f32, {4}}}, DeviceType::cpu);
  expect_error([&] { obs.run(*cpu, {Tensor::zeros({4}, DType::f32)}, none); },
               {"minmax_observer", "states, got 0"});
}

TEST(OpCall, CallOpRunsOnceWithFreshStates) {
  auto cpu = make_device_context(Device::cpu());
  Tensor x = Tensor::from_doubles({4}, {-1, 0.26, 0.74, 3});
  std::vector<Tensor> y = call_op(*cpu, "fake_quantize",
                                  {x, Tensor::scalar(0.5), Tensor::from_vector<int32_t>({}, {0})},
                                  {{"bits", int64_t{8}}, {"signed", true}});
  EXPECT_EQ(y[0].to_doubles(), (std::vector<double>{-1, 0.5, 0.5, 3}));
}

TEST(OpCall, StridedKernelsReadViewsOthersRefuseThem) {
  auto cpu = make_device_context(Device::cpu());
  Tensor x = Tensor::from_doubles({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor transposed = x.as_strided({3, 2}, {1, 3});
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_EQ(transposed.at(1), 4);
  EXPECT_EQ(call_op(*cpu, "cast", {transposed}, {{"dtype", "f64"}})[0].to_doubles(),
            (std::vector<double>{1, 4, 2, 5, 3, 6}));
  Tensor column = x.as_strided({2}, {3}, 1);  // x[:, 1]
  EXPECT_EQ(call_op(*cpu, "cast", {column}, {{"dtype", "bf16"}})[0].to_doubles(),
            (std::vector<double>{2, 5}));
  expect_error([&] { x.as_strided({3, 2}, {1, 4}); }, {"as_strided", "reaches past"});
  expect_error([&] { x.as_strided({3}, {1, 1}); }, {"as_strided", "differ in rank"});
  expect_error([&] { transposed.to(Device::cpu()); }, {"non-contiguous"});
}

}  // namespace
}  // namespace qg
