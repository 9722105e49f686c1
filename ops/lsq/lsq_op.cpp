// lsq_fake_quantize(x, scale, zero_point) -> y: learnable fake quantization (LSQ / LSQ+),
// per tensor, per channel or per group (groups of `group_size` consecutive elements along
// `axis`, a shorter last group allowed), with float scale and zero point that receive
// gradients, as PyTorch's _fake_quantize_learnable_per_{tensor,channel}_affine (per group:
// its per-channel op over the groups as channels). With grad_factor 1 the gradients are
// plain autograd through a straight-through round, torchao's range learning (its
// IntxFakeQuantizeConfig(range_learning=True)): see docs/LLM_NUMERICS.md. The backward is one
// dedicated op, lsq_backward, because dscale and dzero_point are per-scope reductions of
// piecewise terms that no existing op expresses.
#include <cmath>

#include "core/graph.h"
#include "ops/common/quant_args.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/common/schema_helpers.h"
#include "ops/lsq/lsq_cpu.h"

namespace qg {
namespace {

std::vector<AttrSpec> lsq_attrs() {
  AttrSpec g = real_attr("grad_factor", std::nullopt,
                         "scales dscale and dzero_point; unset: 1 / sqrt(numel * quant_max)");
  g.optional = true;
  return concat_attrs(
      concat_attrs(quant_range_attrs(), scope_attrs({"tensor", "channel", "group"})), {g});
}

// Checks x, scale and zero_point (inputs x_index, x_index + 1, x_index + 2) and the attrs.
void check_lsq_inputs(const InferContext& ctx, int xi) {
  expect_float(ctx, xi);
  QuantRange r = quant_range_from_attrs(ctx.op, ctx.attrs);
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, ctx.inputs[xi].shape);
  const char* names[2] = {"scale", "zero_point"};
  for (int k = 0; k < 2; ++k) {
    const TensorType& t = ctx.inputs[xi + 1 + k];
    QG_CHECK(t.dtype == DType::f32 || t.dtype == DType::f64, ctx.op, names[k],
             " must be f32 or f64 (it is learnable), got ", t.str());
    expect_qparam_shape(ctx.op, names[k], t, l);
  }
  lsq_grad_factor(ctx.op, ctx.attrs, ctx.inputs[xi].numel());
  // Constant qparams are checked now, at graph-build time.
  if (const Tensor* s = ctx.constant_inputs[xi + 1])
    for (int64_t i = 0; i < s->numel(); ++i) check_scale_value(ctx.op, s->at(i), i);
  if (const Tensor* z = ctx.constant_inputs[xi + 2])
    for (int64_t i = 0; i < z->numel(); ++i)
      QG_CHECK(std::isfinite(z->at(i)), ctx.op, "zero_point[", i, "] = ", z->at(i),
               " must be finite");
  (void)r;
}

std::vector<TensorType> infer_lsq(const InferContext& ctx) {
  check_lsq_inputs(ctx, 0);
  return {ctx.inputs[0]};
}

std::vector<TensorType> infer_lsq_backward(const InferContext& ctx) {
  check_lsq_inputs(ctx, 1);
  QG_CHECK(ctx.inputs[0] == ctx.inputs[1], ctx.op, "dy ", ctx.inputs[0].str(), " must match x ",
           ctx.inputs[1].str());
  return {ctx.inputs[1], ctx.inputs[2], ctx.inputs[3]};
}

// Reference gradients for the gradient check, written from SEMANTICS.md in f64 without the
// kernel's helpers: classify each element by its unclamped code and apply the table.
std::vector<Tensor> lsq_reference(const std::vector<Tensor>& in, const Tensor& dy,
                                  const Attrs& attrs) {
  const Tensor &x = in[0], &scale = in[1], &zp = in[2];
  QuantRange r = quant_range_from_attrs("lsq_fake_quantize", attrs);
  // Element e of the [outer, axis_len, inner] view around the scope's axis owns qparam
  // qparam_index(o, a, i) (per tensor: outer = numel, axis_len = inner = 1).
  ScopeLayout l = scope_layout("ref", attrs, x.shape());
  double g = attrs.has("grad_factor")
                 ? attrs.get_real("grad_factor")
                 : 1.0 / std::sqrt(static_cast<double>(x.numel()) * static_cast<double>(r.qmax));
  Tensor dx = Tensor::zeros(x.shape(), DType::f64);
  Tensor ds = Tensor::zeros(scale.shape(), DType::f64);
  Tensor dz = Tensor::zeros(zp.shape(), DType::f64);
  for (int64_t e = 0; e < x.numel(); ++e) {
    const int64_t c =
        qparam_index(l, e / (l.axis_len * l.inner), (e / l.inner) % l.axis_len, e % l.inner);
    double s = scale.at(c);
    double z = std::min(std::max(std::nearbyint(zp.at(c)), double(r.qmin)), double(r.qmax));
    double q = std::nearbyint(x.at(e) * (1.0 / s)) + z;
    double w = dy.at(e);
    if (q < r.qmin || q > r.qmax) {
      ds.data<double>()[c] += g * w * ((q < r.qmin ? r.qmin : r.qmax) - z);
      dz.data<double>()[c] += g * w * -s;
    } else {
      dx.data<double>()[e] = w;
      ds.data<double>()[c] += g * w * ((q - z) * s - x.at(e)) / s;
    }
  }
  return {dx, ds, dz};
}

GradcheckSample lsq_sample(const std::string& label, Shape x, Shape qshape, Attrs attrs,
                           double scale, double zp) {
  int64_t nq = shape_numel(qshape);
  std::vector<double> sv(nq), zv(nq);
  for (int64_t i = 0; i < nq; ++i) {
    sv[i] = scale * (1.0 + 0.25 * i);
    zv[i] = zp + i;
  }
  GradcheckSample s(label,
                    {{x, DType::f64, -3.0, 3.0, {}},
                     {qshape, DType::f64, 0, 0, sv},
                     {qshape, DType::f64, 0, 0, zv}},
                    std::move(attrs));
  s.reference = lsq_reference;
  return s;
}

}  // namespace

void add_lsq_cuda_kernels(OpRegistry& r);  // lsq_cuda.cu
void add_lsq_crosscheck(OpRegistry& r);    // lsq_crosscheck.cpp

void define_lsq_ops(OpRegistry& r) {
  OpDef& op = r.define("lsq_fake_quantize");
  op.parse_args = quant_scope_parser(0);
  op.doc = "Learnable fake quantize (LSQ/LSQ+): float scale and zero point get gradients.";
  op.inputs = {"x", "scale", "zero_point"};
  op.outputs = {"y"};
  op.attrs = lsq_attrs();
  op.differentiable_inputs = {true, true, true};
  op.infer = infer_lsq;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, lsq_fake_quantize_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    std::vector<ValueId> g = c.graph.apply(
        "lsq_backward", {c.grad_or_zeros(0), n.inputs[0], n.inputs[1], n.inputs[2]}, n.attrs);
    for (int i = 0; i < 3; ++i)
      if (!c.needs_input_grad[i]) g[i] = kNoValue;
    return g;
  };
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        lsq_sample("per-tensor u8 [4,6]", {4, 6}, {1}, {}, 0.02, 120),
        lsq_sample("per-tensor s4 [3,5] zp 1", {3, 5}, {},
                   {{"bits", 4}, {"signed", true}, {"grad_factor", 0.5}}, 0.25, 1),
        lsq_sample("per-channel axis 0 [3,4]", {3, 4}, {3},
                   {{"scope", "channel"}, {"axis", 0}, {"quant_min", 0}, {"quant_max", 15}}, 0.2,
                   6),
        lsq_sample("per-channel axis -1 [2,3,5] s8", {2, 3, 5}, {5},
                   {{"scope", "channel"}, {"axis", -1}, {"signed", true}}, 0.01, -2),
        lsq_sample("per-channel axis 1 [2,4,3] s3", {2, 4, 3}, {4},
                   {{"scope", "channel"}, {"axis", 1}, {"bits", 3}, {"signed", true}}, 0.3, 0),
        // Learned ranges of the language-model recipes: symmetric int4 weights per group of
        // the [out, in] matrix's rows, plain autograd (grad_factor 1).
        lsq_sample("per-group axis 1 [3,8] g4 s4 gf 1", {3, 8}, {3, 2},
                   {{"scope", "group"},
                    {"axis", 1},
                    {"group_size", 4},
                    {"bits", 4},
                    {"signed", true},
                    {"grad_factor", 1.0}},
                   0.4, 0),
        lsq_sample("per-group axis 0 [5,2] g2 tail u4", {5, 2}, {3, 2},
                   {{"scope", "group"}, {"axis", 0}, {"group_size", 2}, {"bits", 4}}, 0.3, 6),
        lsq_sample("per-group axis -1 [2,3,5] g2 tail s8", {2, 3, 5}, {2, 3, 3},
                   {{"scope", "group"}, {"axis", -1}, {"group_size", 2}, {"signed", true}}, 0.02,
                   -1),
    };
  };

  OpDef& back = r.define("lsq_backward");
  back.parse_args = parse_lsq_backward_args;
  back.doc = "Gradients of lsq_fake_quantize: (dx, dscale, dzero_point) from (dy, x, scale, zp).";
  back.inputs = {"dy", "x", "scale", "zero_point"};
  back.outputs = {"dx", "dscale", "dzero_point"};
  back.attrs = lsq_attrs();
  back.infer = infer_lsq_backward;
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, lsq_backward_cpu});
#ifdef QG_WITH_CUDA
  add_lsq_cuda_kernels(r);
#endif
  add_lsq_crosscheck(r);
}

}  // namespace qg
