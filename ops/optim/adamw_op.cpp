// adamw(param, grad, lr, grad_scale): one AdamW step of a parameter, in place, as
// torch.optim.AdamW (single-tensor path, amsgrad and maximize off) computes it:
//   g = grad * grad_scale                       (the clip coefficient, or 1)
//   t += 1;  p = p * (1 - lr * wd)              (decoupled weight decay, before the moments)
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
//   p = p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// With decoupled = false the decay is Adam's L2 term instead (g = g + wd * p, as the adam op),
// so one op serves both optimizers with a rate that changes without recompiling.
//
// The rate is an input, not an attribute: an f64 scalar (a Graph::variable the trainer writes
// before each step) read where the update runs, so a compiled step and its CUDA graph follow
// a schedule unchanged. It is f64 so that lr / (1 - b1^t) and 1 - lr * wd are formed from the
// same double torch's Python float gives (and adam's lr attribute gives): the runtime rate
// reproduces both bit for bit at any value. grad_scale is an f32 scalar (clip_grad_norm's
// clip_coef); multiplying by an exact 1 leaves the gradient unchanged.
//
// A non-finite grad_scale (clip_grad_norm saw a non-finite norm) or a negative or non-finite
// rate is an error, and the step leaves the parameter, its moments and its step count as
// they were (torch's error_if_nonfinite raises before any update). The CPU kernel throws; the
// CUDA kernel records a device error (raised at the step's synchronisation) and skips.
#include <cmath>

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/optim/optim_attrs.h"
#include "ops/optim/optim_cpu.h"

namespace qg {
namespace {

using optim_attrs::bounded_real;
using optim_attrs::positive_real;

std::vector<TensorType> infer_adamw(const InferContext& ctx) {
  const TensorType& p = ctx.inputs[0];
  QG_CHECK(p.dtype == DType::f32 || p.dtype == DType::f64, ctx.op, "param must be f32 or f64, got ",
           p.str());
  QG_CHECK(ctx.inputs[1] == p, ctx.op, "grad ", ctx.inputs[1].str(), " must match param ", p.str());
  QG_CHECK(ctx.inputs[2].dtype == DType::f64 && ctx.inputs[2].numel() == 1, ctx.op,
           "lr must be an f64 scalar, got ", ctx.inputs[2].str());
  QG_CHECK(ctx.inputs[3].dtype == DType::f32 && ctx.inputs[3].numel() == 1, ctx.op,
           "grad_scale must be an f32 scalar, got ", ctx.inputs[3].str());
  return {};
}

template <typename T>
void adamw_cpu(KernelContext& ctx) {
  const AdamWArgs& a = ctx.args<AdamWArgs>();
  const double lr = ctx.inputs[2].data<double>()[0];
  const float scale = ctx.inputs[3].data<float>()[0];
  QG_CHECK(std::isfinite(lr) && lr >= 0.0, ctx.op, "learning rate ", lr,
           " must be finite and >= 0; the step was skipped");
  QG_CHECK(std::isfinite(scale), ctx.op, "grad_scale ", scale,
           " is not finite (the gradient norm was not finite); the step was skipped");
  const T g_scale = static_cast<T>(scale);
  const T* grad = ctx.inputs[1].data<T>();
  adam_step<T>(ctx, AdamStep{lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.decoupled},
               ctx.inputs[1], [&](int64_t i) { return grad[i] * g_scale; });
}

}  // namespace

void add_adamw_cuda_kernel(OpRegistry& r);  // adamw_cuda.cu

void define_adamw(OpRegistry& r) {
  OpDef& op = r.define("adamw");
  op.doc =
      "AdamW step (torch.optim.AdamW, amsgrad off) with the rate read from an f64 scalar input "
      "and the gradient scaled by grad_scale; updates param in place.";
  op.inputs = {"param", "grad", "lr", "grad_scale"};
  op.attrs = {bounded_real("beta1", 0.9, "first-moment decay", 0.0, 1.0, true),
              bounded_real("beta2", 0.999, "second-moment decay", 0.0, 1.0, true),
              positive_real("eps", 1e-8, "denominator term"),
              bounded_real("weight_decay", 0.01, "weight decay", 0.0, 1e30, false),
              bool_attr("decoupled", true,
                        "decoupled decay p *= 1 - lr * wd (AdamW); false: L2 term (Adam)")};
  op.infer = infer_adamw;
  op.states = [](const InferContext& ctx) {
    return std::vector<StateSpec>{{"exp_avg", ctx.inputs[0], 0.0},
                                  {"exp_avg_sq", ctx.inputs[0], 0.0},
                                  {"step", {DType::i64, {1}}, 0.0}};
  };
  op.side_effects = true;
  op.parse_args = parse_adamw_args;
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, [](KernelContext& ctx) {
                          if (ctx.inputs[0].dtype() == DType::f64)
                            adamw_cpu<double>(ctx);
                          else
                            adamw_cpu<float>(ctx);
                        }});
#ifdef QG_WITH_CUDA
  add_adamw_cuda_kernel(r);
#endif
}

}  // namespace qg
