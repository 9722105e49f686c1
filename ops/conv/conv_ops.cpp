// conv2d (NCHW, PyTorch's torch.nn.functional.conv2d semantics) and its three backward ops.
//   conv2d                  {x [N, C, H, W], w [O, C/groups, kH, kW], b [O]} -> {y [N, O, Ho, Wo]}
//   conv2d_backward_input   {dy, w} -> {dx}   (attribute input_shape = x's shape)
//   conv2d_backward_weight  {dy, x} -> {dw}   (attribute weight_shape = w's shape)
//   conv2d_backward_bias    {dy}    -> {db [O]}  (sum over N, Ho, Wo)
// Ho = (H + 2 pH - dH (kH - 1) - 1) / sH + 1, likewise Wo. The bias is always an input;
// callers without one pass a zero constant (its gradient is then simply not requested).
#include "core/error.h"
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/conv/conv_cpu.h"
#include "ops/conv/conv_geometry.h"

namespace qg {
namespace {

// One [h, w] attribute: two values, each >= lo. The attribute validators call it for given
// values; conv_geometry calls it again (defaults, kernels handed attributes directly).
void check_pair(const std::string& op, const std::string& name, const std::vector<int64_t>& v,
                int64_t lo) {
  QG_CHECK(v.size() == 2, op, "attribute '", name, "' must have 2 values [", name, "_h, ", name,
           "_w], got ", v.size(), ": ", Attr(v).str());
  QG_CHECK(v[0] >= lo && v[1] >= lo, op, "attribute '", name, "' = ", Attr(v).str(),
           lo == 0 ? " must be non-negative" : " must be positive (>= 1)");
}

AttrSpec pair_attr(const std::string& name, int64_t def, int64_t lo, const std::string& doc) {
  AttrSpec s = ints_attr(name, std::vector<int64_t>{def, def}, doc);
  s.validate = [name, lo](const std::string& op, const Attr& v) {
    check_pair(op, name, v.as_ints(), lo);
  };
  return s;
}

AttrSpec shape4_attr(const std::string& name, const std::string& doc) {
  AttrSpec s = ints_attr(name, std::nullopt, doc);
  s.validate = [name](const std::string& op, const Attr& v) {
    const auto& d = v.as_ints();
    QG_CHECK(d.size() == 4, op, "attribute '", name, "' must have 4 values, got ", d.size(), ": ",
             v.str());
    for (int64_t e : d)
      QG_CHECK(e >= 0, op, "attribute '", name, "' = ", v.str(), " has a negative size");
  };
  return s;
}

std::vector<AttrSpec> conv_attrs() {
  return {pair_attr("stride", 1, 1, "[sH, sW], >= 1"),
          pair_attr("padding", 0, 0, "[pH, pW] zeros added on both sides, >= 0"),
          pair_attr("dilation", 1, 1, "[dH, dW] spacing of the kernel taps, >= 1"),
          int_attr("groups", 1, "channel groups; groups == C is depthwise", 1)};
}

// Forwards the convolution attributes of `attrs` (resolved) to a backward node.
Attrs conv_attrs_of(const Attrs& attrs) {
  return {{"stride", attrs.get_ints("stride")},
          {"padding", attrs.get_ints("padding")},
          {"dilation", attrs.get_ints("dilation")},
          {"groups", attrs.get_int("groups")}};
}

void expect_same_float(const InferContext& ctx, const std::vector<std::string>& names) {
  expect_f32_or_f64(ctx, 0);
  bool same = true;
  for (const TensorType& t : ctx.inputs) same = same && t.dtype == ctx.inputs[0].dtype;
  if (same) return;
  std::string list;
  for (size_t i = 0; i < names.size(); ++i)
    list += (i ? ", " : "") + names[i] + " " + ctx.inputs[i].str();
  QG_FAIL(ctx.op, "dtype mismatch: every input must have one dtype, got ", list);
}

void expect_grad_shape(const InferContext& ctx, const ConvGeometry& g) {
  const Shape& dy = ctx.inputs[0].shape;
  QG_CHECK(dy == g.y_shape(), ctx.op, "input dy has shape ", shape_str(dy),
           " but the convolution's output is ", shape_str(g.y_shape()), " (x ",
           shape_str(g.x_shape()), ", w ", shape_str(g.w_shape()), ")");
}

std::vector<GradcheckSample> conv2d_samples() {
  auto sample = [](std::string label, Shape x, Shape w, Attrs attrs) {
    Shape b = {w[0]};
    return GradcheckSample(std::move(label), {{x}, {w}, {b}}, std::move(attrs));
  };
  std::vector<GradcheckSample> s;
  s.push_back(sample("3x3 plain", {2, 2, 5, 5}, {3, 2, 3, 3}, {}));
  s.push_back(sample("stride 2 padding 1", {1, 2, 6, 5}, {2, 2, 3, 3},
                     {{"stride", {2, 2}}, {"padding", {1, 1}}}));
  s.push_back(sample("stride [2,1] padding [0,2] 2x3 kernel", {2, 1, 5, 4}, {2, 1, 2, 3},
                     {{"stride", {2, 1}}, {"padding", {0, 2}}}));
  s.push_back(sample("dilation 2 padding 2", {1, 2, 7, 6}, {2, 2, 3, 3},
                     {{"dilation", {2, 2}}, {"padding", {2, 2}}}));
  s.push_back(sample("groups 2", {2, 4, 5, 5}, {6, 2, 3, 3}, {{"groups", 2}, {"padding", {1, 1}}}));
  s.push_back(sample("depthwise stride 2", {2, 3, 6, 6}, {3, 1, 3, 3},
                     {{"groups", 3}, {"stride", {2, 2}}, {"padding", {1, 1}}}));
  s.push_back(sample("depthwise multiplier 2 dilation [1,2]", {1, 2, 5, 7}, {4, 1, 2, 2},
                     {{"groups", 2}, {"dilation", {1, 2}}}));
  return s;
}

}  // namespace

ConvGeometry conv_geometry(const std::string& op, const Shape& x, const Shape& w,
                           const Attrs& attrs) {
  QG_CHECK(x.size() == 4, op, "input x must have rank 4 in NCHW layout [N, C, H, W], got shape ",
           shape_str(x));
  QG_CHECK(w.size() == 4, op, "weight w must have rank 4 [O, C/groups, kH, kW], got shape ",
           shape_str(w));
  const auto& stride = attrs.get_ints("stride");
  const auto& padding = attrs.get_ints("padding");
  const auto& dilation = attrs.get_ints("dilation");
  check_pair(op, "stride", stride, 1);
  check_pair(op, "padding", padding, 0);
  check_pair(op, "dilation", dilation, 1);
  ConvGeometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.kh = w[2], g.kw = w[3];
  g.sh = stride[0], g.sw = stride[1], g.ph = padding[0], g.pw = padding[1];
  g.dh = dilation[0], g.dw = dilation[1];
  g.groups = attrs.get_int("groups");
  QG_CHECK(g.groups >= 1, op, "attribute 'groups' = ", g.groups, " must be positive (>= 1)");
  QG_CHECK(g.c % g.groups == 0, op, "attribute 'groups' = ", g.groups,
           " does not divide the input channels C = ", g.c, " (x ", shape_str(x), ", NCHW)");
  QG_CHECK(g.o % g.groups == 0, op, "attribute 'groups' = ", g.groups,
           " does not divide the output channels O = ", g.o, " (w ", shape_str(w), ")");
  QG_CHECK(w[1] * g.groups == g.c, op, "channel mismatch: x ", shape_str(x),
           " (NCHW) has C = ", g.c, " channels but w ", shape_str(w), " with groups = ", g.groups,
           " expects C = w.shape[1] * groups = ", w[1] * g.groups);
  QG_CHECK(g.kh >= 1 && g.kw >= 1, op, "weight w ", shape_str(w), " has an empty kernel");
  const int64_t span_h = g.dh * (g.kh - 1) + 1, span_w = g.dw * (g.kw - 1) + 1;
  const int64_t padded_h = g.h + 2 * g.ph, padded_w = g.w + 2 * g.pw;
  QG_CHECK(span_h <= padded_h && span_w <= padded_w, op, "the kernel ", g.kh, "x", g.kw,
           " (dilation ", Attr(dilation).str(), ", spanning ", span_h, "x", span_w,
           ") is larger than the padded input ", padded_h, "x", padded_w, " (H = ", g.h,
           ", W = ", g.w, ", padding ", Attr(padding).str(), "): the output would be empty");
  g.ho = (padded_h - span_h) / g.sh + 1;
  g.wo = (padded_w - span_w) / g.sw + 1;
  return g;
}

std::shared_ptr<const KernelArgs> parse_conv_args(const ArgsSource& s) {
  QG_CHECK(s.inputs.size() >= 2, s.op, "takes at least 2 inputs, got ", s.inputs.size());
  auto args = std::make_shared<ConvArgs>();
  if (s.op == "conv2d_backward_input")
    args->geometry =
        conv_geometry(s.op, s.attrs.get_ints("input_shape"), s.inputs[1].shape, s.attrs);
  else if (s.op == "conv2d_backward_weight")
    args->geometry =
        conv_geometry(s.op, s.inputs[1].shape, s.attrs.get_ints("weight_shape"), s.attrs);
  else
    args->geometry = conv_geometry(s.op, s.inputs[0].shape, s.inputs[1].shape, s.attrs);
  return args;
}

void add_conv_cuda_kernels(OpRegistry& r);  // conv_cuda.cu
void add_conv_crosscheck(OpRegistry& r);    // conv_crosscheck.cpp

void define_conv_ops(OpRegistry& r) {
  {
    OpDef& op = r.define("conv2d");
    op.doc =
        "2-D convolution (cross-correlation) in NCHW, as torch.nn.functional.conv2d: "
        "y = conv(x, w) + b.";
    op.inputs = {"x", "w", "b"};
    op.outputs = {"y"};
    op.attrs = conv_attrs();
    op.differentiable_inputs = {true, true, true};
    op.infer = [](const InferContext& ctx) {
      ConvGeometry g = conv_geometry(ctx.op, ctx.inputs[0].shape, ctx.inputs[1].shape, ctx.attrs);
      expect_same_float(ctx, {"x", "w", "b"});
      QG_CHECK(ctx.inputs[2].shape == Shape{g.o}, ctx.op, "bias b must have shape [O] = [", g.o,
               "] (O = w.shape[0]), got ", ctx.inputs[2].str());
      return std::vector<TensorType>{{ctx.inputs[0].dtype, g.y_shape()}};
    };
    op.parse_args = parse_conv_args;
    op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                            const ConvGeometry& g = ctx.args<ConvArgs>().geometry;
                            conv2d_forward_cpu(g, ctx.inputs[0], ctx.inputs[1], ctx.inputs[2],
                                               ctx.outputs[0]);
                          }});
    op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
      ValueId dy = c.grad_or_zeros(0);
      ValueId x = c.node.inputs[0], w = c.node.inputs[1];
      Attrs attrs = conv_attrs_of(c.node.attrs);
      ValueId dx = kNoValue, dw = kNoValue, db = kNoValue;
      if (c.needs_input_grad[0]) {
        Attrs a = attrs;
        a.set("input_shape", c.graph.value(x).type.shape);
        dx = c.graph.apply1("conv2d_backward_input", {dy, w}, a);
      }
      if (c.needs_input_grad[1]) {
        Attrs a = attrs;
        a.set("weight_shape", c.graph.value(w).type.shape);
        dw = c.graph.apply1("conv2d_backward_weight", {dy, x}, a);
      }
      if (c.needs_input_grad[2]) db = c.graph.apply1("conv2d_backward_bias", {dy});
      return {dx, dw, db};
    };
    op.gradcheck_samples = conv2d_samples;
  }
  {
    OpDef& op = r.define("conv2d_backward_input");
    op.doc = "dx of conv2d: the transposed convolution of dy with w, shaped input_shape.";
    op.inputs = {"dy", "w"};
    op.outputs = {"dx"};
    op.attrs = conv_attrs();
    op.attrs.push_back(shape4_attr("input_shape", "x's shape [N, C, H, W]"));
    op.infer = [](const InferContext& ctx) {
      const Shape& xs = ctx.attrs.get_ints("input_shape");
      ConvGeometry g = conv_geometry(ctx.op, xs, ctx.inputs[1].shape, ctx.attrs);
      expect_same_float(ctx, {"dy", "w"});
      expect_grad_shape(ctx, g);
      return std::vector<TensorType>{{ctx.inputs[0].dtype, g.x_shape()}};
    };
    op.parse_args = parse_conv_args;
    op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                            const ConvGeometry& g = ctx.args<ConvArgs>().geometry;
                            conv2d_backward_input_cpu(g, ctx.inputs[0], ctx.inputs[1],
                                                      ctx.outputs[0]);
                          }});
  }
  {
    OpDef& op = r.define("conv2d_backward_weight");
    op.doc = "dw of conv2d: sum over images of dy correlated with x, shaped weight_shape.";
    op.inputs = {"dy", "x"};
    op.outputs = {"dw"};
    op.attrs = conv_attrs();
    op.attrs.push_back(shape4_attr("weight_shape", "w's shape [O, C/groups, kH, kW]"));
    op.infer = [](const InferContext& ctx) {
      const Shape& ws = ctx.attrs.get_ints("weight_shape");
      ConvGeometry g = conv_geometry(ctx.op, ctx.inputs[1].shape, ws, ctx.attrs);
      expect_same_float(ctx, {"dy", "x"});
      expect_grad_shape(ctx, g);
      return std::vector<TensorType>{{ctx.inputs[0].dtype, g.w_shape()}};
    };
    op.parse_args = parse_conv_args;
    op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                            const ConvGeometry& g = ctx.args<ConvArgs>().geometry;
                            conv2d_backward_weight_cpu(g, ctx.inputs[0], ctx.inputs[1],
                                                       ctx.outputs[0]);
                          }});
  }
  {
    OpDef& op = r.define("conv2d_backward_bias");
    op.doc = "db of conv2d: dy [N, O, Ho, Wo] summed over N, Ho and Wo.";
    op.inputs = {"dy"};
    op.outputs = {"db"};
    op.infer = [](const InferContext& ctx) {
      expect_f32_or_f64(ctx, 0);
      const Shape& dy = ctx.inputs[0].shape;
      QG_CHECK(dy.size() == 4, ctx.op,
               "input dy must have rank 4 in NCHW layout [N, O, Ho, Wo], "
               "got shape ",
               shape_str(dy));
      return std::vector<TensorType>{{ctx.inputs[0].dtype, {dy[1]}}};
    };
    op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                            conv2d_backward_bias_cpu(ctx.inputs[0], ctx.outputs[0]);
                          }});
  }
#ifdef QG_WITH_CUDA
  add_conv_cuda_kernels(r);
#endif
  add_conv_crosscheck(r);
}

}  // namespace qg
