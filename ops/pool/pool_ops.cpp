// Pooling over NCHW planes, with PyTorch's semantics (torch.nn.functional.max_pool2d with
// return_indices, avg_pool2d, and the mean over H, W as global average pooling). The window
// rules are in ops/pool/pool_geometry.h; the backward ops take the forward's attributes plus
// `input_shape`.
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/pool/pool_attrs.h"
#include "ops/pool/pool_cpu.h"

namespace qg {
namespace {

std::vector<AttrSpec> window_attrs(bool max_pool) {
  AttrSpec stride = ints_attr("stride", std::nullopt, "window step [sH, sW] (default: kernel)");
  stride.optional = true;
  std::vector<AttrSpec> a = {
      ints_attr("kernel", std::nullopt, "window size [kH, kW]"), stride,
      ints_attr("padding", std::vector<int64_t>{0, 0}, "implicit padding [pH, pW] <= kernel / 2"),
      bool_attr("ceil_mode", false, "round the output size up (windows start inside input)")};
  if (max_pool)
    a.push_back(ints_attr("dilation", std::vector<int64_t>{1, 1}, "window dilation [dH, dW]"));
  else
    a.push_back(bool_attr("count_include_pad", true, "padded cells count in the divisor"));
  return a;
}

// The forward attributes plus the input shape, for the backward op.
Attrs backward_attrs(const BackwardContext& c) {
  Attrs a = c.node.attrs;
  a.set("input_shape", c.graph.value(c.node.inputs[0]).type.shape);
  return a;
}

// dy (and indices) must be shaped like the forward output of `input_shape`.
std::vector<TensorType> infer_pool_backward(const InferContext& ctx) {
  expect_float(ctx, 0);
  const Shape in = ctx.attrs.get_ints("input_shape");
  const pool::PoolGeom g = pool_geometry(ctx.op, in, ctx.attrs);
  const Shape out = {in[0], in[1], g.OH, g.OW};
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    QG_CHECK(ctx.inputs[i].shape == out, ctx.op, "input ", i, " ", ctx.inputs[i].str(),
             " must have the pooled shape ", shape_str(out), " of input_shape ", shape_str(in));
  if (ctx.inputs.size() > 1)
    QG_CHECK(ctx.inputs[1].dtype == DType::i64, ctx.op, "indices must be i64, got ",
             ctx.inputs[1].str());
  return {{ctx.inputs[0].dtype, in}};
}

// Distinct values 0.02 apart (37 is coprime with every size used), so no window has a
// near-tie that a central difference could flip.
std::vector<double> distinct_values(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37) % n) * 0.02 - 1.0;
  return v;
}

GradcheckSample pool_sample(const std::string& label, const Shape& shape, Attrs attrs,
                            bool distinct) {
  GradcheckSample s{label, {{shape}}, std::move(attrs)};
  if (distinct) s.inputs[0].values = distinct_values(shape_numel(shape));
  return s;
}

void define_max_pool(OpRegistry& r) {
  OpDef& op = r.define("max_pool2d");
  op.doc =
      "Max over k x k windows of NCHW planes; indices = h * W + w of the chosen cell. A NaN "
      "in a window wins (the last NaN), as in PyTorch.";
  op.inputs = {"x"};
  op.outputs = {"y", "indices"};
  op.attrs = window_attrs(true);
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    const Shape& x = ctx.inputs[0].shape;
    const pool::PoolGeom g = pool_geometry(ctx.op, x, ctx.attrs);
    const Shape out = {x[0], x[1], g.OH, g.OW};
    return std::vector<TensorType>{{ctx.inputs[0].dtype, out}, {DType::i64, out}};
  };
  op.parse_args = parse_pool_args;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, cpu::max_pool2d});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("max_pool2d_backward", {c.grad_or_zeros(0), c.node.outputs[1]},
                           backward_attrs(c))};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        pool_sample("k2", {2, 2, 4, 5}, {{"kernel", {2, 2}}}, true),
        pool_sample(
            "k3 s2 p1 ceil", {1, 2, 6, 7},
            {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", true}},
            true),
        pool_sample(
            "k2x3 s1 dil2 p1", {1, 3, 6, 7},
            {{"kernel", {2, 3}}, {"stride", {1, 2}}, {"padding", {1, 1}}, {"dilation", {2, 2}}},
            true),
        pool_sample("k3 s1 overlapping", {2, 1, 5, 5}, {{"kernel", {3, 3}}, {"stride", {1, 1}}},
                    true)};
  };

  OpDef& back = r.define("max_pool2d_backward");
  back.doc = "dx[indices] += dy per plane (windows may overlap).";
  back.inputs = {"dy", "indices"};
  back.outputs = {"dx"};
  back.attrs = window_attrs(true);
  back.attrs.push_back(ints_attr("input_shape", std::nullopt, "the forward input's NCHW shape"));
  back.infer = infer_pool_backward;
  back.parse_args = parse_pool_args;
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, cpu::max_pool2d_backward});
}

void define_avg_pool(OpRegistry& r) {
  OpDef& op = r.define("avg_pool2d");
  op.doc = "Mean over k x k windows of NCHW planes (PyTorch's divisor rules).";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = window_attrs(false);
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    const Shape& x = ctx.inputs[0].shape;
    const pool::PoolGeom g = pool_geometry(ctx.op, x, ctx.attrs);
    return std::vector<TensorType>{{ctx.inputs[0].dtype, {x[0], x[1], g.OH, g.OW}}};
  };
  op.parse_args = parse_pool_args;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, cpu::avg_pool2d});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("avg_pool2d_backward", {c.grad_or_zeros(0)}, backward_attrs(c))};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        pool_sample("k2", {2, 2, 4, 6}, {{"kernel", {2, 2}}}, false),
        pool_sample(
            "k3 s2 p1 ceil", {1, 2, 6, 7},
            {{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}, {"ceil_mode", true}},
            false),
        pool_sample("k3 s2 p1 ceil exclude-pad", {1, 2, 6, 7},
                    {{"kernel", {3, 3}},
                     {"stride", {2, 2}},
                     {"padding", {1, 1}},
                     {"ceil_mode", true},
                     {"count_include_pad", false}},
                    false),
        pool_sample("k2x3 s1", {1, 1, 4, 5}, {{"kernel", {2, 3}}, {"stride", {1, 1}}}, false)};
  };

  OpDef& back = r.define("avg_pool2d_backward");
  back.doc = "dx = sum over the windows holding a cell of dy / divisor.";
  back.inputs = {"dy"};
  back.outputs = {"dx"};
  back.attrs = window_attrs(false);
  back.attrs.push_back(ints_attr("input_shape", std::nullopt, "the forward input's NCHW shape"));
  back.infer = infer_pool_backward;
  back.parse_args = parse_pool_args;
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, cpu::avg_pool2d_backward});
}

void define_global_avg_pool(OpRegistry& r) {
  OpDef& op = r.define("global_avg_pool2d");
  op.doc =
      "y[n, c] = mean of x[n, c, :, :] (32 interleaved partial sums folded pairwise, then "
      "divided by H * W).";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    const Shape& x = ctx.inputs[0].shape;
    QG_CHECK(x.size() == 4, ctx.op, "input x must be rank 4 (N, C, H, W), got shape ",
             shape_str(x));
    QG_CHECK(x[2] > 0 && x[3] > 0, ctx.op, "input x must have H, W > 0, got shape ", shape_str(x));
    return std::vector<TensorType>{{ctx.inputs[0].dtype, {x[0], x[1]}}};
  };
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, cpu::global_avg_pool2d});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    Attrs a;
    a.set("input_shape", c.graph.value(c.node.inputs[0]).type.shape);
    return {c.graph.apply1("global_avg_pool2d_backward", {c.grad_or_zeros(0)}, a)};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{pool_sample("[2,3,4,5]", {2, 3, 4, 5}, {}, false),
                                        pool_sample("[1,2,1,1]", {1, 2, 1, 1}, {}, false)};
  };

  OpDef& back = r.define("global_avg_pool2d_backward");
  back.doc = "dx[n, c, h, w] = dy[n, c] / (H * W).";
  back.inputs = {"dy"};
  back.outputs = {"dx"};
  back.attrs = {ints_attr("input_shape", std::nullopt, "the forward input's NCHW shape")};
  back.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    const Shape in = ctx.attrs.get_ints("input_shape");
    QG_CHECK(in.size() == 4 && in[2] > 0 && in[3] > 0, ctx.op,
             "attribute 'input_shape' must be NCHW with H, W > 0, got ", shape_str(in));
    QG_CHECK(ctx.inputs[0].shape == Shape({in[0], in[1]}), ctx.op, "dy ", ctx.inputs[0].str(),
             " must be [N, C] of input_shape ", shape_str(in));
    return std::vector<TensorType>{{ctx.inputs[0].dtype, in}};
  };
  back.parse_args = no_kernel_args;  // the input shape is the output's
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, cpu::global_avg_pool2d_backward});
}

}  // namespace

void add_pool_cuda_kernels(OpRegistry& r);  // pool_cuda.cu
void add_pool_crosscheck(OpRegistry& r);    // pool_crosscheck.cpp

void define_pool_ops(OpRegistry& r) {
  define_max_pool(r);
  define_avg_pool(r);
  define_global_avg_pool(r);
#ifdef QG_WITH_CUDA
  add_pool_cuda_kernels(r);
#endif
  add_pool_crosscheck(r);
}

}  // namespace qg
