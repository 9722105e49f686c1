// batch_norm and layer_norm (PyTorch's F.batch_norm / F.layer_norm semantics) and their
// backward ops.
//   batch_norm           {x [N, C, ...], gamma [C], beta [C], running_mean [C], running_var [C]}
//                        -> {y, save_mean [C], save_invstd [C], used_batch_stats [1]}
//   batch_norm_backward  {dy, x, gamma, save_mean, save_invstd, used_batch_stats}
//                        -> {dx, dgamma, dbeta}
//   layer_norm           {x [..., D], gamma [D], beta [D]} -> {y, mean [...], rstd [...]}
//   layer_norm_backward  {dy, x, gamma, mean, rstd} -> {dx, dgamma, dbeta}
// running_mean / running_var are module buffers (graph parameters no optimizer updates): in
// training the kernel normalises with the batch statistics and updates them in place,
// r = (1 - momentum) r + momentum * batch (unbiased variance for running_var), as torch does;
// in eval mode, or while the node's `frozen` state is non-zero (torch.ao's freeze_bn_stats),
// it normalises with them and updates nothing. Which of the two happened is decided on the
// device (the flag is device state), so the forward reports it as `used_batch_stats` and the
// backward reads it: through the batch statistics the gradient has two more terms.
#include <cmath>

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/norm/norm_args.h"
#include "ops/norm/norm_cpu.h"

namespace qg {
namespace {

AttrSpec bounded_real(const std::string& name, double def, double lo, double hi, bool lo_open,
                      const std::string& doc) {
  AttrSpec s = real_attr(name, def, doc);
  s.validate = [name, lo, hi, lo_open](const std::string& op, const Attr& v) {
    double x = v.as_real();
    bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
    QG_CHECK(ok, op, "attribute '", name, "' = ", x, " must be in ", lo_open ? "(" : "[", lo, ", ",
             hi, "]");
  };
  return s;
}

// Every input has x's dtype; inputs `first`.. are vectors of length `len` (what `what` is).
void expect_vectors(const InferContext& ctx, int first, int last, int64_t len,
                    const std::string& what) {
  for (int i = first; i <= last; ++i) {
    expect_same_dtype(ctx, 0, i);
    QG_CHECK(ctx.inputs[i].shape == Shape{len}, ctx.op, "input ", i, " must be [", len, "] (", what,
             "), got ", ctx.inputs[i].str(), " for x ", ctx.inputs[0].str());
  }
}

void define_batch_norm(OpRegistry& r) {
  OpDef& op = r.define("batch_norm");
  op.doc = "Batch normalisation over every axis but 1; running statistics updated in training.";
  op.inputs = {"x", "gamma", "beta", "running_mean", "running_var"};
  op.outputs = {"y", "save_mean", "save_invstd", "used_batch_stats"};
  op.attrs = {bounded_real("momentum", 0.1, 0.0, 1.0, false, "running-statistics update weight"),
              bounded_real("eps", 1e-5, 0.0, 1e300, true, "added to the variance")};
  op.differentiable_inputs = {true, true, true, false, false};
  op.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    const TensorType& x = ctx.inputs[0];
    QG_CHECK(x.shape.size() >= 2, ctx.op, "x must be [N, C, ...] (rank >= 2, channels on axis 1),",
             " got ", x.str());
    expect_vectors(ctx, 1, 4, x.shape[1], "one value per channel of axis 1");
    TensorType stats{x.dtype, {x.shape[1]}};
    return std::vector<TensorType>{x, stats, stats, {x.dtype, {1}}};
  };
  op.states = [](const InferContext&) {
    return std::vector<StateSpec>{{"frozen", {DType::f32, {1}}, 0.0}};
  };
  op.parse_args = parse_norm_args;
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, norm::batch_norm_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    auto g = c.graph.apply("batch_norm_backward", {c.grad_or_zeros(0), n.inputs[0], n.inputs[1],
                                                   n.outputs[1], n.outputs[2], n.outputs[3]});
    return {g[0], g[1], g[2], kNoValue, kNoValue};
  };
  op.gradcheck_samples = [] {
    auto sample = [](const std::string& label, Shape x) {
      int64_t c = x[1];
      return GradcheckSample{
          label, {{x}, {{c}, DType::f64, 0.5, 1.5}, {{c}}, {{c}}, {{c}, DType::f64, 0.5, 1.5}}, {}};
    };
    return std::vector<GradcheckSample>{sample("[3,2,2,3] batch stats", {3, 2, 2, 3}),
                                        sample("[5,3] batch stats", {5, 3})};
  };

  OpDef& back = r.define("batch_norm_backward");
  back.doc = "dx, dgamma, dbeta of batch_norm; the mean/variance terms when batch stats were used.";
  back.inputs = {"dy", "x", "gamma", "save_mean", "save_invstd", "used_batch_stats"};
  back.outputs = {"dx", "dgamma", "dbeta"};
  back.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    const TensorType& x = ctx.inputs[1];
    QG_CHECK(x.shape.size() >= 2 && ctx.inputs[0] == x, ctx.op, "dy ", ctx.inputs[0].str(),
             " must match x ", x.str(), " (rank >= 2)");
    for (int i = 2; i <= 4; ++i) {
      expect_same_dtype(ctx, 0, i);
      QG_CHECK(ctx.inputs[i].shape == Shape{x.shape[1]}, ctx.op, "input ", i, " must be [",
               x.shape[1], "], got ", ctx.inputs[i].str());
    }
    QG_CHECK(ctx.inputs[5] == (TensorType{x.dtype, {1}}), ctx.op,
             "used_batch_stats must be a one-element ", dtype_name(x.dtype), " tensor, got ",
             ctx.inputs[5].str());
    TensorType stats{x.dtype, {x.shape[1]}};
    return std::vector<TensorType>{x, stats, stats};
  };
  back.kernels.push_back({DeviceType::cpu, kF32F64DTypes, norm::batch_norm_backward_cpu});
}

void define_layer_norm(OpRegistry& r) {
  OpDef& op = r.define("layer_norm");
  op.doc = "Normalisation over the last axis with an affine gamma, beta.";
  op.inputs = {"x", "gamma", "beta"};
  op.outputs = {"y", "mean", "rstd"};
  op.attrs = {bounded_real("eps", 1e-5, 0.0, 1e300, true, "added to the variance")};
  op.differentiable_inputs = {true, true, true};
  op.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    const TensorType& x = ctx.inputs[0];
    QG_CHECK(!x.shape.empty() && x.shape.back() > 0, ctx.op,
             "x must have a non-empty last axis to normalise over, got ", x.str());
    expect_vectors(ctx, 1, 2, x.shape.back(), "one value per element of the last axis");
    TensorType rows{x.dtype, Shape(x.shape.begin(), x.shape.end() - 1)};
    return std::vector<TensorType>{x, rows, rows};
  };
  op.parse_args = parse_norm_args;
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, norm::layer_norm_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    auto g = c.graph.apply("layer_norm_backward", {c.grad_or_zeros(0), n.inputs[0], n.inputs[1],
                                                   n.outputs[1], n.outputs[2]});
    return {g[0], g[1], g[2]};
  };
  op.gradcheck_samples = [] {
    auto sample = [](const std::string& label, Shape x) {
      int64_t d = x.back();
      return GradcheckSample{label, {{x}, {{d}, DType::f64, 0.5, 1.5}, {{d}}}, {}};
    };
    return std::vector<GradcheckSample>{sample("[4,5]", {4, 5}), sample("[2,3,6]", {2, 3, 6})};
  };

  OpDef& back = r.define("layer_norm_backward");
  back.doc = "dx, dgamma, dbeta of layer_norm.";
  back.inputs = {"dy", "x", "gamma", "mean", "rstd"};
  back.outputs = {"dx", "dgamma", "dbeta"};
  back.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    const TensorType& x = ctx.inputs[1];
    QG_CHECK(!x.shape.empty() && ctx.inputs[0] == x, ctx.op, "dy ", ctx.inputs[0].str(),
             " must match x ", x.str());
    const Shape rows(x.shape.begin(), x.shape.end() - 1);
    expect_same_dtype(ctx, 0, 2);
    QG_CHECK(ctx.inputs[2].shape == Shape{x.shape.back()}, ctx.op, "gamma must be [",
             x.shape.back(), "], got ", ctx.inputs[2].str());
    for (int i = 3; i <= 4; ++i) {
      expect_same_dtype(ctx, 0, i);
      QG_CHECK(ctx.inputs[i].shape == rows, ctx.op, "input ", i, " must be ", shape_str(rows),
               ", got ", ctx.inputs[i].str());
    }
    TensorType vec{x.dtype, {x.shape.back()}};
    return std::vector<TensorType>{x, vec, vec};
  };
  back.kernels.push_back({DeviceType::cpu, kF32F64DTypes, norm::layer_norm_backward_cpu});
}

}  // namespace

void define_channel_div_ops(OpRegistry& r);  // channel_div_ops.cpp

void add_norm_cuda_kernels(OpRegistry& r);  // norm_cuda.cu
void add_norm_crosscheck(OpRegistry& r);    // norm_crosscheck.cpp

void define_norm_ops(OpRegistry& r) {
  define_batch_norm(r);
  define_layer_norm(r);
  define_channel_div_ops(r);
#ifdef QG_WITH_CUDA
  add_norm_cuda_kernels(r);
#endif
  add_norm_crosscheck(r);
}

}  // namespace qg
