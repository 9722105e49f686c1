// conv_bn_fold_weight: the batch-norm fold of a QAT conv-bn block (nn/conv_bn.cpp), as
// torch.ao.nn.intrinsic.qat.ConvBn2d computes it, in one node instead of five:
//   running_std  = sqrt(running_var + eps)
//   scale_factor = gamma / running_std
//   w_fold       = w * scale_factor.reshape(O, 1, 1, 1)
// and its backward in one node instead of six (mul, mul, sum_to's two passes on the GPU, the
// accumulating add, div):
//   dw     = d_w_fold * scale_factor[o]
//   dgamma = (d_scale_factor + sum_{rest of w's axes}(d_w_fold * w)) / running_std
// running_var is a buffer: no gradient.
//
// Bits. The kernels repeat the generic chain's roundings exactly, so replacing the chain
// changes no bit (tests/ops_fold pin this for f32 and f64, forward and gradients):
//  - eps is rounded to T first: the chain added an f32 scalar constant holding float(eps);
//  - running_var + eps, the sqrt, the division and each product are rounded to T one at a
//    time (the arith ops compute f32 in f32 and f64 in f64; no FMA contraction: the build
//    passes -ffp-contract=off and nvcc --fmad=false);
//  - the sum over w's other axes is sum_to's: each product rounded to T, then added in f64
//    from 0.0 in row-major order, rounded once to T;
//  - d_scale_factor + that sum is autograd's accumulation of scale_factor's two readers, in
//    its order: the later reader (channel_div, or the batch-norm fusion that replaces it)
//    contributes first, the fold's reshape second; the generic add rounds a + b to T;
//  - dgamma is div's d(numerator) = grad / denominator with the forward's running_std. The
//    backward takes the saved running_std, not running_var: batch_norm updates running_var in
//    place during the forward, so re-deriving it in the backward would read the new value.
// An absent d_scale_factor is zeros: the f64 sum starts at +0.0 and so is never -0 (x + -0
// is x; +0 + -0 is +0), nor does a nonzero f64 sum of T values round to -0 in T (it is a
// multiple of T's smallest subnormal), so +0 + sum == sum bit for bit, NaN payloads included.
#include <cmath>

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/common/schema_helpers.h"
#include "ops/fold/fold_args.h"

namespace qg {
namespace {

// eps must stay positive once rounded to T (the chain's f32 constant held float(eps)).
void check_eps(const InferContext& ctx, DType dtype) {
  const double eps = ctx.attrs.get_real("eps");
  const double rounded = dtype == DType::f32 ? static_cast<double>(static_cast<float>(eps)) : eps;
  QG_CHECK(std::isfinite(eps) && eps > 0 && rounded > 0 && std::isfinite(rounded), ctx.op,
           "attribute 'eps' = ", eps, " must be positive and finite in ", dtype_name(dtype),
           " (rounded: ", rounded, ")");
}

// w [O, ...] (rank >= 1) and per-channel vectors [O] of w's dtype at `first`..`last`.
void expect_channel_vectors(const InferContext& ctx, int w_input, int first, int last,
                            const std::vector<std::string>& names) {
  const TensorType& w = ctx.inputs[w_input];
  QG_CHECK(!w.shape.empty(), ctx.op, "w must be [O, ...] (rank >= 1, output channels on axis 0),",
           " got ", w.str());
  for (int i = first; i <= last; ++i) {
    QG_CHECK(ctx.inputs[i].dtype == w.dtype, ctx.op, names[i - first], " ", ctx.inputs[i].str(),
             " must have w's dtype ", dtype_name(w.dtype));
    QG_CHECK(ctx.inputs[i].shape == Shape{w.shape[0]}, ctx.op, names[i - first], " must be [",
             w.shape[0], "] (one value per output channel, axis 0 of w), got ", ctx.inputs[i].str(),
             " for w ", w.str());
  }
}

template <typename T>
void fold_forward_typed(KernelContext& ctx) {
  const Tensor& wt = ctx.inputs[0];
  const int64_t channels = wt.shape()[0];
  const int64_t per = channels == 0 ? 0 : wt.numel() / channels;
  const T eps = static_cast<T>(ctx.args<FoldArgs>().eps);
  const T* w = wt.data<T>();
  const T* gamma = ctx.inputs[1].data<T>();
  const T* var = ctx.inputs[2].data<T>();
  T* w_fold = ctx.outputs[0].data<T>();
  T* scale_factor = ctx.outputs[1].data<T>();
  T* running_std = ctx.outputs[2].data<T>();
  for (int64_t o = 0; o < channels; ++o) {
    const T shifted = var[o] + eps;
    const T sd = std::sqrt(shifted);
    const T sf = gamma[o] / sd;
    running_std[o] = sd;
    scale_factor[o] = sf;
    for (int64_t i = o * per; i < (o + 1) * per; ++i) w_fold[i] = w[i] * sf;
  }
}

template <typename T>
void fold_backward_typed(KernelContext& ctx) {
  const Tensor& dt = ctx.inputs[0];
  const int64_t channels = dt.shape()[0];
  const int64_t per = channels == 0 ? 0 : dt.numel() / channels;
  const T* d_w_fold = dt.data<T>();
  const T* d_scale_factor = ctx.inputs[1].data<T>();
  const T* w = ctx.inputs[2].data<T>();
  const T* scale_factor = ctx.inputs[3].data<T>();
  const T* running_std = ctx.inputs[4].data<T>();
  T* dw = ctx.outputs[0].data<T>();
  T* dgamma = ctx.outputs[1].data<T>();
  for (int64_t o = 0; o < channels; ++o) {
    const T sf = scale_factor[o];
    double sum = 0;  // sum_to's accumulator: f64 from +0.0, row-major
    for (int64_t i = o * per; i < (o + 1) * per; ++i) {
      dw[i] = d_w_fold[i] * sf;
      sum += static_cast<double>(static_cast<T>(d_w_fold[i] * w[i]));
    }
    const T d_sf = d_scale_factor[o] + static_cast<T>(sum);
    dgamma[o] = d_sf / running_std[o];
  }
}

}  // namespace

void add_fold_cuda_kernels(OpRegistry& r);  // conv_bn_fold_cuda.cu
void add_fold_crosscheck(OpRegistry& r);    // fold_crosscheck.cpp

void define_fold_ops(OpRegistry& r) {
  OpDef& op = r.define("conv_bn_fold_weight");
  op.doc =
      "Batch-norm fold of a QAT conv-bn (torch.ao ConvBn2d): running_std = sqrt(running_var + "
      "eps), scale_factor = gamma / running_std, w_fold = w * scale_factor[o].";
  op.inputs = {"w", "gamma", "running_var"};
  op.outputs = {"w_fold", "scale_factor", "running_std"};
  op.attrs = {real_attr("eps", 1e-5, "added to running_var (rounded to the tensors' dtype)")};
  op.differentiable_inputs = {true, true, false};  // running_var is a buffer
  op.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    expect_channel_vectors(ctx, 0, 1, 2, {"gamma", "running_var"});
    check_eps(ctx, ctx.inputs[0].dtype);
    const TensorType vec{ctx.inputs[0].dtype, {ctx.inputs[0].shape[0]}};
    return std::vector<TensorType>{ctx.inputs[0], vec, vec};
  };
  op.parse_args = parse_fold_args;
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                          dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
                            fold_forward_typed<decltype(tag)>(ctx);
                          });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    // running_std depends on running_var alone: a gradient reaching it goes nowhere.
    auto g = c.graph.apply(
        "conv_bn_fold_weight_backward",
        {c.grad_or_zeros(0), c.grad_or_zeros(1), n.inputs[0], n.outputs[1], n.outputs[2]});
    // No gradient for w_fold: w gets none from here (the chain's mul got none either).
    const bool dw = c.needs_input_grad[0] && c.output_grads[0] != kNoValue;
    return {dw ? g[0] : kNoValue, c.needs_input_grad[1] ? g[1] : kNoValue, kNoValue};
  };
  op.gradcheck_samples = [] {
    // Gammas of both signs; variances positive (a buffer of squares).
    GradcheckInput w{{3, 2, 2, 2}}, w2{{4, 5}};
    GradcheckInput gamma_pos{{3}, DType::f64, 0.5, 1.5}, gamma_neg{{4}, DType::f64, -1.5, -0.5};
    GradcheckInput var3{{3}, DType::f64, 0.5, 2.0}, var4{{4}, DType::f64, 0.05, 2.0};
    GradcheckSample fold_w{"w_fold [3,2,2,2]", {w, gamma_pos, var3}, {{"eps", 1e-5}}};
    GradcheckSample fold_sf{"scale_factor [3]", {w, gamma_pos, var3}, {{"eps", 1e-5}}};
    fold_sf.output = 1;
    GradcheckSample fold_neg{"w_fold [4,5] gamma < 0", {w2, gamma_neg, var4}, {{"eps", 1e-3}}};
    return std::vector<GradcheckSample>{fold_w, fold_sf, fold_neg};
  };

  OpDef& back = r.define("conv_bn_fold_weight_backward");
  back.doc =
      "conv_bn_fold_weight's backward: dw = d_w_fold * scale_factor[o], dgamma = (d_scale_factor "
      "+ sum(d_w_fold * w) over w's other axes) / running_std.";
  back.inputs = {"d_w_fold", "d_scale_factor", "w", "scale_factor", "running_std"};
  back.outputs = {"dw", "dgamma"};
  back.infer = [](const InferContext& ctx) {
    expect_f32_or_f64(ctx, 0);
    QG_CHECK(ctx.inputs[0] == ctx.inputs[2], ctx.op, "d_w_fold ", ctx.inputs[0].str(),
             " must match w ", ctx.inputs[2].str());
    expect_channel_vectors(ctx, 0, 3, 4, {"scale_factor", "running_std"});
    expect_channel_vectors(ctx, 0, 1, 1, {"d_scale_factor"});
    return std::vector<TensorType>{ctx.inputs[0], ctx.inputs[1]};
  };
  back.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                            dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op, [&](auto tag) {
                              fold_backward_typed<decltype(tag)>(ctx);
                            });
                          }});
#ifdef QG_WITH_CUDA
  add_fold_cuda_kernels(r);
#endif
  add_fold_crosscheck(r);
}

}  // namespace qg
