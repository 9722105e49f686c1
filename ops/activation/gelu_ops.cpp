// gelu (PyTorch's F.gelu, approximate = "none" | "tanh") and gelu_backward (dx = dy * gelu'(x)),
// the derivative a plain graph op so both backends and the passes see it. Element math in
// ops/activation/activation_math.h.
#include "core/graph.h"
#include "ops/activation/activation_math.h"
#include "ops/activation/gelu_args.h"
#include "ops/common/cpu_loops.h"
#include "ops/common/schema_helpers.h"

namespace qg {
namespace {

AttrSpec approximate_attr() {
  return string_attr("approximate", std::string("none"), {"none", "tanh"},
                     "none: 0.5 x (1 + erf(x / sqrt 2)); tanh: the tanh approximation");
}

void gelu_cpu(KernelContext& ctx) {
  if (ctx.args<GeluArgs>().tanh)
    cpu::unary_float("gelu", ctx.inputs[0], ctx.outputs[0],
                     [](auto x) { return act::gelu_tanh(x); });
  else
    cpu::unary_float("gelu", ctx.inputs[0], ctx.outputs[0],
                     [](auto x) { return act::gelu_erf(x); });
}

void gelu_backward_cpu(KernelContext& ctx) {
  if (ctx.args<GeluArgs>().tanh)
    cpu::binary_float("gelu_backward", ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                      [](auto dy, auto x) { return dy * act::gelu_tanh_grad(x); });
  else
    cpu::binary_float("gelu_backward", ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                      [](auto dy, auto x) { return dy * act::gelu_erf_grad(x); });
}

std::vector<TensorType> infer_dy_x(const InferContext& ctx) {
  expect_float(ctx, 0);
  expect_same_dtype(ctx, 0, 1);
  QG_CHECK(ctx.inputs[0].shape == ctx.inputs[1].shape, ctx.op, "dy ", ctx.inputs[0].str(),
           " and x ", ctx.inputs[1].str(), " must have the same shape");
  return same_as_input(ctx);
}

}  // namespace

void define_gelu_ops(OpRegistry& r) {
  OpDef& gelu = r.define("gelu");
  gelu.doc =
      "y = 0.5 x (1 + erf(x / sqrt 2)), or with approximate=tanh "
      "0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).";
  gelu.inputs = {"x"};
  gelu.outputs = {"y"};
  gelu.attrs = {approximate_attr()};
  gelu.differentiable_inputs = {true};
  gelu.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    return same_as_input(ctx);
  };
  gelu.parse_args = parse_gelu_args;
  gelu.kernels.push_back({DeviceType::cpu, kFloatDTypes, gelu_cpu});
  gelu.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    Attrs a;
    a.set("approximate", c.node.attrs.get_string("approximate"));
    return {c.graph.apply1("gelu_backward", {c.grad_or_zeros(0), c.node.inputs[0]}, a)};
  };
  gelu.gradcheck_samples = [] {
    std::vector<GradcheckSample> out;
    for (const char* form : {"none", "tanh"}) {
      GradcheckSample s{
          std::string("[3,7] ") + form, {{{3, 7}, DType::f64, -4.0, 4.0}}, {{"approximate", form}}};
      out.push_back(s);
    }
    return out;
  };

  OpDef& back = r.define("gelu_backward");
  back.doc = "dx = dy * gelu'(x) for the chosen form.";
  back.inputs = {"dy", "x"};
  back.outputs = {"dx"};
  back.attrs = {approximate_attr()};
  back.infer = infer_dy_x;
  back.parse_args = parse_gelu_args;
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, gelu_backward_cpu});
}

}  // namespace qg
