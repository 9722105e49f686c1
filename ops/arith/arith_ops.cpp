// Element-wise arithmetic with NumPy broadcasting (add, sub, mul, div, neg, sqrt) and the
// shape ops their gradients need (sum_to, broadcast_to, reshape).
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/graph.h"
#include "ops/arith/reshape_args.h"
#include "ops/common/cpu_loops.h"
#include "ops/common/grad_helpers.h"
#include "ops/common/schema_helpers.h"

namespace qg {
namespace {

std::vector<TensorType> infer_binary(const InferContext& ctx) {
  expect_float(ctx, 0);
  expect_float(ctx, 1);
  expect_same_dtype(ctx, 0, 1);
  return {TensorType{ctx.inputs[0].dtype,
                     broadcast_shapes(ctx.op, ctx.inputs[0].shape, ctx.inputs[1].shape)}};
}

std::vector<GradcheckSample> binary_samples() {
  GradcheckSample same{"same shape", {{{3, 4}}, {{3, 4}}}, {}};
  GradcheckSample bcast{"broadcast [2,3,4]x[4]", {{{2, 3, 4}}, {{4}}}, {}};
  GradcheckSample col{"broadcast [3,1]x[1,5]", {{{3, 1}}, {{1, 5}}}, {}};
  return {same, bcast, col};
}

template <typename F>
void define_binary(OpRegistry& r, const char* name, const char* doc, F f, BackwardFn backward) {
  OpDef& op = r.define(name);
  op.doc = doc;
  op.inputs = {"a", "b"};
  op.outputs = {"y"};
  op.differentiable_inputs = {true, true};
  op.infer = infer_binary;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [name, f](KernelContext& ctx) {
                          cpu::binary_float(name, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], f);
                        }});
  op.backward = std::move(backward);
  op.gradcheck_samples = binary_samples;
}

std::vector<ValueId> add_backward(BackwardContext& c) {
  ValueId dy = c.grad_or_zeros(0);
  const Node& n = c.node;
  return {sum_to_shape(c.graph, dy, shape_of(c.graph, n.inputs[0])),
          sum_to_shape(c.graph, dy, shape_of(c.graph, n.inputs[1]))};
}

std::vector<ValueId> sub_backward(BackwardContext& c) {
  ValueId dy = c.grad_or_zeros(0);
  const Node& n = c.node;
  ValueId db = kNoValue;
  if (c.needs_input_grad[1])
    db = sum_to_shape(c.graph, c.graph.apply1("neg", {dy}), shape_of(c.graph, n.inputs[1]));
  return {sum_to_shape(c.graph, dy, shape_of(c.graph, n.inputs[0])), db};
}

std::vector<ValueId> mul_backward(BackwardContext& c) {
  ValueId dy = c.grad_or_zeros(0);
  const Node& n = c.node;
  ValueId da = kNoValue, db = kNoValue;
  if (c.needs_input_grad[0])
    da = sum_to_shape(c.graph, c.graph.apply1("mul", {dy, n.inputs[1]}),
                      shape_of(c.graph, n.inputs[0]));
  if (c.needs_input_grad[1])
    db = sum_to_shape(c.graph, c.graph.apply1("mul", {dy, n.inputs[0]}),
                      shape_of(c.graph, n.inputs[1]));
  return {da, db};
}

// y = a / b: da = dy / b, db = -dy * a / b^2 = -(dy / b) * y.
std::vector<ValueId> div_backward(BackwardContext& c) {
  ValueId dy = c.grad_or_zeros(0);
  const Node& n = c.node;
  ValueId dy_over_b = c.graph.apply1("div", {dy, n.inputs[1]});
  ValueId da = kNoValue, db = kNoValue;
  if (c.needs_input_grad[0]) da = sum_to_shape(c.graph, dy_over_b, shape_of(c.graph, n.inputs[0]));
  // The sign flips after the reduction: exact either way (negation commutes with rounding),
  // and on a broadcast divisor (conv-bn's per-channel scale) it then touches C values, not
  // the whole activation.
  if (c.needs_input_grad[1])
    db = c.graph.apply1("neg",
                        {sum_to_shape(c.graph, c.graph.apply1("mul", {dy_over_b, n.outputs[0]}),
                                      shape_of(c.graph, n.inputs[1]))});
  return {da, db};
}

// Divisors kept away from 0 so central differences stay well conditioned.
std::vector<GradcheckSample> div_samples() {
  GradcheckSample same{"same shape", {{{3, 4}}, {{3, 4}, DType::f64, 0.5, 2.0}}, {}};
  GradcheckSample bcast{"broadcast [2,3,4]/[4]", {{{2, 3, 4}}, {{4}, DType::f64, -2.0, -0.5}}, {}};
  GradcheckSample col{"broadcast [3,1]/[1,5]", {{{3, 1}}, {{1, 5}, DType::f64, 0.5, 2.0}}, {}};
  return {same, bcast, col};
}

// y = sqrt(x), IEEE correctly rounded in the math type (CUDA's sqrt is too, without
// fast-math), so CPU and GPU agree bit for bit. dx = dy / (2 y) = (dy / y) * 0.5.
void define_sqrt(OpRegistry& r) {
  OpDef& op = r.define("sqrt");
  op.doc = "y = sqrt(x) (NaN for x < 0)";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    return same_as_input(ctx);
  };
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          cpu::unary_float("sqrt", ctx.inputs[0], ctx.outputs[0],
                                           [](auto v) { return std::sqrt(v); });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    Graph& g = c.graph;
    ValueId y = c.node.outputs[0];
    ValueId half = g.constant(Tensor::scalar(0.5, g.value(y).type.dtype));
    return {g.apply1("mul", {g.apply1("div", {c.grad_or_zeros(0), y}), half})};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        {"[2,5] in [0.2, 3]", {{{2, 5}, DType::f64, 0.2, 3.0}}, {}}};
  };
}

void define_neg(OpRegistry& r) {
  OpDef& op = r.define("neg");
  op.doc = "y = -x";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    return same_as_input(ctx);
  };
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          cpu::unary_float("neg", ctx.inputs[0], ctx.outputs[0],
                                           [](auto v) { return -v; });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("neg", {c.grad_or_zeros(0)})};
  };
  op.gradcheck_samples = [] { return std::vector<GradcheckSample>{{"[5]", {{{5}}}, {}}}; };
}

// Sums x over the dimensions that broadcasting would expand from `shape`.
void define_sum_to(OpRegistry& r) {
  OpDef& op = r.define("sum_to");
  op.doc = "Sums x down to `shape` (the inverse of broadcasting).";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {ints_attr("shape", std::nullopt, "target shape, broadcastable to x")};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    const auto& target = ctx.attrs.get_ints("shape");
    Shape b = broadcast_shapes(ctx.op, target, ctx.inputs[0].shape);
    QG_CHECK(b == ctx.inputs[0].shape, ctx.op, "shape ", shape_str(target),
             " does not broadcast to the input shape ", shape_str(ctx.inputs[0].shape));
    return std::vector<TensorType>{{ctx.inputs[0].dtype, target}};
  };
  op.parse_args = no_kernel_args;  // the target shape is the output's
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          const Tensor& x = ctx.inputs[0];
                          Tensor& y = ctx.outputs[0];
                          dispatch_float(x.dtype(), "sum_to", [&](auto tag) {
                            using T = decltype(tag);
                            std::vector<double> acc(static_cast<size_t>(y.numel()), 0.0);
                            const T* px = x.data<T>();
                            // Map each x element to its y offset by broadcasting y's shape to x's.
                            cpu::for_each_broadcast(x.shape(), x.shape(), y.shape(),
                                                    [&](int64_t i, int64_t, int64_t o) {
                                                      acc[o] += static_cast<double>(px[i]);
                                                    });
                            T* py = y.data<T>();
                            for (size_t i = 0; i < acc.size(); ++i) py[i] = static_cast<T>(acc[i]);
                          });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {broadcast_to_shape(c.graph, c.grad_or_zeros(0), shape_of(c.graph, c.node.inputs[0]))};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{{"[2,3,4]->[3,1]", {{{2, 3, 4}}}, {{"shape", Shape{3, 1}}}},
                                        {"[2,3]->[]", {{{2, 3}}}, {{"shape", Shape{}}}}};
  };
}

void define_broadcast_to(OpRegistry& r) {
  OpDef& op = r.define("broadcast_to");
  op.doc = "Broadcasts x to `shape` (NumPy rules).";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {ints_attr("shape", std::nullopt, "target shape")};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    const auto& target = ctx.attrs.get_ints("shape");
    Shape b = broadcast_shapes(ctx.op, ctx.inputs[0].shape, target);
    QG_CHECK(b == target, ctx.op, "input shape ", shape_str(ctx.inputs[0].shape),
             " does not broadcast to ", shape_str(target));
    return std::vector<TensorType>{{ctx.inputs[0].dtype, target}};
  };
  op.parse_args = no_kernel_args;  // the target shape is the output's
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          const Tensor& x = ctx.inputs[0];
                          Tensor& y = ctx.outputs[0];
                          dispatch_float(x.dtype(), "broadcast_to", [&](auto tag) {
                            using T = decltype(tag);
                            const T* px = x.data<T>();
                            T* py = y.data<T>();
                            cpu::parallel_for_each_broadcast(
                                y.shape(), x.shape(), y.shape(),
                                [&](int64_t o, int64_t i, int64_t) { py[o] = px[i]; });
                          });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {sum_to_shape(c.graph, c.grad_or_zeros(0), shape_of(c.graph, c.node.inputs[0]))};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        {"[3,1]->[2,3,4]", {{{3, 1}}}, {{"shape", Shape{2, 3, 4}}}}};
  };
}

void define_reshape(OpRegistry& r) {
  OpDef& op = r.define("reshape");
  op.doc = "A view of x with a new shape (same element count).";
  op.aliases_input = true;
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {ints_attr("shape", std::nullopt, "new shape")};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    const auto& target = ctx.attrs.get_ints("shape");
    for (int64_t d : target)
      QG_CHECK(d >= 0, ctx.op, "attribute 'shape' = ", shape_str(target),
               " has a negative dimension");
    QG_CHECK(shape_numel(target) == ctx.inputs[0].numel(), ctx.op, "cannot reshape ",
             ctx.inputs[0].str(), " to ", shape_str(target), ": element counts differ");
    return std::vector<TensorType>{{ctx.inputs[0].dtype, target}};
  };
  op.parse_args = parse_reshape_args;
  op.kernels.push_back({DeviceType::cpu, {}, [](KernelContext& ctx) {
                          ctx.outputs[0] = ctx.inputs[0].reshape(ctx.outputs[0].shape());
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("reshape", {c.grad_or_zeros(0)},
                           {{"shape", shape_of(c.graph, c.node.inputs[0])}})};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{{"[2,6]->[3,4]", {{{2, 6}}}, {{"shape", Shape{3, 4}}}}};
  };
}

}  // namespace

void add_arith_cuda_kernels(OpRegistry& r);  // arith_cuda.cu
void add_arith_crosscheck(OpRegistry& r);    // arith_crosscheck.cpp

void define_arith_ops(OpRegistry& r) {
  define_binary(
      r, "add", "y = a + b (broadcasting)", [](auto a, auto b) { return a + b; }, add_backward);
  define_binary(
      r, "sub", "y = a - b (broadcasting)", [](auto a, auto b) { return a - b; }, sub_backward);
  define_binary(
      r, "mul", "y = a * b (broadcasting)", [](auto a, auto b) { return a * b; }, mul_backward);
  define_binary(
      r, "div", "y = a / b (broadcasting; IEEE division)", [](auto a, auto b) { return a / b; },
      div_backward);
  r.get_mutable("div").gradcheck_samples = div_samples;
  define_neg(r);
  define_sqrt(r);
  define_sum_to(r);
  define_broadcast_to(r);
  define_reshape(r);
#ifdef QG_WITH_CUDA
  add_arith_cuda_kernels(r);
#endif
  add_arith_crosscheck(r);
}

}  // namespace qg
