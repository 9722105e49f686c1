// sum and mean over a set of axes (all axes by default), accumulated in f64.
#include <algorithm>

#include "core/graph.h"
#include "ops/common/cpu_loops.h"
#include "ops/common/grad_helpers.h"
#include "ops/common/schema_helpers.h"
#include "ops/reduce/reduce_args.h"

namespace qg {
namespace {

// The input shape with reduced axes set to 1.
Shape keepdim_shape(const std::string& op, const Shape& in, const std::vector<int64_t>& axes) {
  Shape k = in;
  if (axes.empty()) {
    std::fill(k.begin(), k.end(), 1);
    return k;
  }
  std::vector<bool> seen(in.size(), false);
  for (int64_t a : axes) {
    int ax = normalize_axis(op, "axes", a, static_cast<int>(in.size()));
    QG_CHECK(!seen[ax], op, "attribute 'axes' names axis ", a, " twice");
    seen[ax] = true;
    k[ax] = 1;
  }
  return k;
}

Shape reduced_shape(const std::string& op, const Shape& in, const std::vector<int64_t>& axes,
                    bool keepdim) {
  Shape k = keepdim_shape(op, in, axes);
  if (keepdim) return k;
  Shape out;
  std::vector<bool> reduced(in.size(), axes.empty());
  for (int64_t a : axes) reduced[normalize_axis(op, "axes", a, static_cast<int>(in.size()))] = true;
  for (size_t i = 0; i < in.size(); ++i)
    if (!reduced[i]) out.push_back(in[i]);
  return out;
}

void reduce_cpu(KernelContext& ctx, bool mean) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  const Shape& k = ctx.args<ReduceArgs>().keep;
  dispatch_float(x.dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<double> acc(static_cast<size_t>(y.numel()), 0.0);
    const T* px = x.data<T>();
    cpu::for_each_broadcast(x.shape(), x.shape(), k, [&](int64_t i, int64_t, int64_t o) {
      acc[o] += static_cast<double>(px[i]);
    });
    double count = y.numel() == 0 ? 0.0 : static_cast<double>(x.numel()) / y.numel();
    T* py = y.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) py[i] = static_cast<T>(mean ? acc[i] / count : acc[i]);
  });
}

std::shared_ptr<const KernelArgs> parse_reduce_args(const ArgsSource& s) {
  auto args = std::make_shared<ReduceArgs>();
  args->keep = keepdim_shape(s.op, s.inputs.at(0).shape, s.attrs.get_ints("axes"));
  return args;
}

void define_reduce(OpRegistry& r, const char* name, bool mean) {
  OpDef& op = r.define(name);
  op.doc = mean ? "Mean over `axes` (all when empty)." : "Sum over `axes` (all when empty).";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {ints_attr("axes", std::vector<int64_t>{}, "axes to reduce; empty = all"),
              bool_attr("keepdim", false, "keep reduced axes as size 1")};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    Shape s = reduced_shape(ctx.op, ctx.inputs[0].shape, ctx.attrs.get_ints("axes"),
                            ctx.attrs.get_bool("keepdim"));
    return std::vector<TensorType>{{ctx.inputs[0].dtype, s}};
  };
  op.parse_args = parse_reduce_args;
  op.kernels.push_back(
      {DeviceType::cpu, kFloatDTypes, [mean](KernelContext& ctx) { reduce_cpu(ctx, mean); }});
  op.backward = [mean](BackwardContext& c) -> std::vector<ValueId> {
    Graph& g = c.graph;
    const Value x = g.value(c.node.inputs[0]);  // a copy: the value table grows below
    Shape k = keepdim_shape(c.node.op->name, x.type.shape, c.node.attrs.get_ints("axes"));
    ValueId dy = g.apply1("reshape", {c.grad_or_zeros(0)}, {{"shape", k}});
    ValueId dx = broadcast_to_shape(g, dy, x.type.shape);
    if (mean) {
      int64_t count = shape_numel(k) == 0 ? 0 : x.type.numel() / shape_numel(k);
      double inv = count == 0 ? 0.0 : 1.0 / static_cast<double>(count);
      dx = g.apply1("mul", {dx, g.constant(Tensor::scalar(inv, x.type.dtype))});
    }
    return {dx};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        {"all of [3,4]", {{{3, 4}}}, {}},
        {"axis 1 of [2,3,4]", {{{2, 3, 4}}}, {{"axes", Shape{1}}}},
        {"axes (0,-1) keepdim", {{{2, 3, 4}}}, {{"axes", Shape{0, -1}}, {"keepdim", true}}}};
  };
}

}  // namespace

void add_reduce_cuda_kernels(OpRegistry& r);  // reduce_cuda.cu
void add_reduce_crosscheck(OpRegistry& r);    // reduce_crosscheck.cpp

void define_reduce_ops(OpRegistry& r) {
  define_reduce(r, "sum", false);
  define_reduce(r, "mean", true);
#ifdef QG_WITH_CUDA
  add_reduce_cuda_kernels(r);
#endif
  add_reduce_crosscheck(r);
}

}  // namespace qg
