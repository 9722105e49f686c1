// fake_quantize(x, scale, zero_point) -> (y, mask): quantize-dequantize with qparams given as
// tensors (so an observer node can feed them), per tensor, channel, token or group. The
// mask output is bit-packed (1 bit per element) and is all the STE backward needs, so x
// need not be kept for the backward pass.
#include <cmath>

#include "core/graph.h"
#include "ops/common/bitmask.h"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/common/schema_helpers.h"
#include "ops/fake_quantize/fake_quantize_cpu.h"

namespace qg {
namespace {

std::vector<TensorType> infer_fake_quantize(const InferContext& ctx) {
  expect_float(ctx, 0);
  quant_range_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[0].shape);
  QG_CHECK(ctx.inputs[1].dtype == DType::f32 || ctx.inputs[1].dtype == DType::f64, ctx.op,
           "scale must be f32 or f64, got ", ctx.inputs[1].str());
  QG_CHECK(ctx.inputs[2].dtype == DType::i32 || ctx.inputs[2].dtype == DType::i64, ctx.op,
           "zero_point must be i32 or i64, got ", ctx.inputs[2].str());
  expect_qparam_shape(ctx.op, "scale", ctx.inputs[1], l);
  expect_qparam_shape(ctx.op, "zero_point", ctx.inputs[2], l);
  // Constant qparams are checked now, at graph-build time.
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  if (ctx.constant_inputs[1] != nullptr)
    for (int64_t i = 0; i < ctx.constant_inputs[1]->numel(); ++i)
      check_scale_value(ctx.op, ctx.constant_inputs[1]->at(i), i);
  if (ctx.constant_inputs[2] != nullptr)
    for (int64_t i = 0; i < ctx.constant_inputs[2]->numel(); ++i)
      check_zero_point_value(ctx.op, ctx.constant_inputs[2]->at(i), r, i);
  return {ctx.inputs[0], TensorType{DType::u8, {bitmask_bytes(ctx.inputs[0].numel())}}};
}

// Reference STE gradient for the gradient check, written from SEMANTICS.md independently of
// the kernel: dx = dy where qmin <= rint(x / scale) + zp <= qmax.
std::vector<Tensor> ste_reference(const std::vector<Tensor>& in, const Tensor& dy,
                                  const Attrs& attrs) {
  QuantRange r = quant_range_from_attrs("fake_quantize", attrs);
  ScopeLayout l = scope_layout("fake_quantize", attrs, in[0].shape());
  Tensor dx = Tensor::zeros(in[0].shape(), DType::f64);
  double* pdx = dx.data<double>();
  for (int64_t o = 0, k = 0; o < l.outer; ++o)
    for (int64_t a = 0; a < l.axis_len; ++a)
      for (int64_t i = 0; i < l.inner; ++i, ++k) {
        int64_t qi = qparam_index(l, o, a, i);
        double q = std::nearbyint(in[0].at(k) * (1.0 / in[1].at(qi))) + in[2].at(qi);
        pdx[k] = (q >= r.qmin && q <= r.qmax) ? dy.at(k) : 0.0;
      }
  return {dx, Tensor(), Tensor()};
}

GradcheckSample ste_sample(const std::string& label, Shape x, Shape qshape, Attrs attrs,
                           double scale, int64_t zp) {
  GradcheckSample s;
  s.label = label;
  int64_t nq = shape_numel(qshape);
  GradcheckInput xs{x, DType::f64, -3.0, 3.0, {}};
  GradcheckInput ss{qshape, DType::f64, 0, 0, std::vector<double>(nq, scale)};
  for (int64_t i = 0; i < nq; ++i) ss.values[i] = scale * (1.0 + 0.25 * i);
  GradcheckInput zs{qshape, DType::i32, 0, 0, std::vector<double>(nq, static_cast<double>(zp))};
  s.inputs = {xs, ss, zs};
  s.attrs = attrs;
  s.reference = ste_reference;
  return s;
}

}  // namespace

void add_fake_quantize_cuda_kernels(OpRegistry& r);  // fake_quantize_cuda.cu
void add_fake_quantize_crosscheck(OpRegistry& r);    // fake_quantize_crosscheck.cpp

void define_fake_quantize_ops(OpRegistry& r) {
  OpDef& op = r.define("fake_quantize");
  op.parse_args = quant_scope_parser(0);
  op.doc = "Quantize-dequantize with tensor qparams; outputs y and a bit-packed in-range mask.";
  op.inputs = {"x", "scale", "zero_point"};
  op.outputs = {"y", "mask"};
  op.attrs = concat_attrs(quant_range_attrs(), scope_attrs());
  op.differentiable_inputs = {true, false, false};
  op.infer = infer_fake_quantize;
  // PyTorch's FakeQuantize flag, kept on the node's device so toggling it needs no graph
  // rebuild and no host synchronisation: 0 makes the node an identity with an all-ones mask.
  op.states = [](const InferContext&) {
    return std::vector<StateSpec>{{"fake_quant_enabled", {DType::u8, {1}}, 1}};
  };
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, fake_quantize_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    ValueId dx = c.graph.apply1("ste_backward", {c.grad_or_zeros(0), c.node.outputs[1]});
    return {dx, kNoValue, kNoValue};
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        ste_sample("per-tensor u8 [4,6]", {4, 6}, {1}, {}, 0.02, 128),
        ste_sample("per-tensor s4 [3,5]", {3, 5}, {1}, {{"bits", 4}, {"signed", true}}, 0.25, 0),
        ste_sample("per-channel axis -1 [3,4]", {3, 4}, {4},
                   {{"scope", "channel"}, {"axis", -1}, {"signed", true}}, 0.01, 0),
        ste_sample("per-token [2,3,4]", {2, 3, 4}, {2, 3, 1}, {{"scope", "token"}}, 0.015, 100),
        ste_sample(
            "per-group 3 axis 1 [2,7]", {2, 7}, {2, 3},
            {{"scope", "group"}, {"axis", 1}, {"group_size", 3}, {"signed", true}, {"bits", 4}},
            0.3, -1),
    };
  };

  const auto infer_ste_backward = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    QG_CHECK(ctx.inputs[1].dtype == DType::u8 && ctx.inputs[1].shape.size() == 1, ctx.op,
             "mask must be a 1-D u8 bit mask, got ", ctx.inputs[1].str());
    int64_t want = bitmask_bytes(ctx.inputs[0].numel());
    QG_CHECK(ctx.inputs[1].shape[0] == want, ctx.op, "mask has ", ctx.inputs[1].shape[0],
             " bytes but dy ", ctx.inputs[0].str(), " needs ", want);
    return same_as_input(ctx);
  };
  OpDef& ste = r.define("ste_backward");
  ste.doc = "Straight-through estimator: dx = dy where the bit-packed mask is set, else 0.";
  ste.inputs = {"dy", "mask"};
  ste.outputs = {"dx"};
  ste.infer = infer_ste_backward;
  ste.kernels.push_back({DeviceType::cpu, kFloatDTypes, ste_backward_cpu});

  // The torch ops' backward (qatgraph.torch): PyTorch's `dy * mask` bit for bit. The graph's
  // ste_backward writes +0 where the mask is clear, which the fusions that absorb it rely on;
  // this op is never fused.
  OpDef& exact = r.define("ste_backward_exact");
  exact.doc =
      "Straight-through estimator as PyTorch computes it: dx = dy * mask, a float multiply "
      "(a masked-out element is dy * 0: a zero with dy's sign, NaN for an infinite or NaN dy).";
  exact.inputs = {"dy", "mask"};
  exact.outputs = {"dx"};
  exact.infer = infer_ste_backward;
  exact.kernels.push_back({DeviceType::cpu, kFloatDTypes, ste_backward_exact_cpu});
#ifdef QG_WITH_CUDA
  add_fake_quantize_cuda_kernels(r);
#endif
  add_fake_quantize_crosscheck(r);
}

}  // namespace qg
