// Optimizer steps as graph ops: sgd(param, grad) and adam(param, grad) update the parameter's
// state tensor in place (a parameter node hands out its state as its value, so input 0 IS the
// persistent tensor). They have no outputs and run as Executor::run targets
// (side_effects = true); nn::Optimizer adds control dependencies so a step runs after every
// reader of the parameter. The optimizer state (momentum buffer, Adam moments, step count)
// is node state, so checkpoints capture it with everything else.
//
// Formulas follow PyTorch's torch.optim (single-tensor path, maximize = False):
//   SGD:  g = grad + wd * p;  buf = step == 0 ? g : momentum * buf + (1 - dampening) * g;
//         g = nesterov ? g + momentum * buf : buf (when momentum != 0);  p = p - lr * g
//   Adam: g = grad + wd * p;  t += 1;  m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
//         p = p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The gradient has the parameter's dtype, or bf16/f16 for an f32 parameter: it is then widened
// exactly to f32 as it is read, bit for bit the cast node a mixed-precision backward ends with
// (the fuse_grad_cast pass, optim_cast_fusion.cpp, removes that cast).
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/graph.h"
#include "core/thread_pool.h"
#include "ops/cast/cast_element.h"
#include "ops/common/schema_helpers.h"
#include "ops/optim/optim_attrs.h"
#include "ops/optim/optim_cast_fusion.h"
#include "ops/optim/optim_cpu.h"

namespace qg {
namespace {

using optim_attrs::bounded_real;
using optim_attrs::positive_real;

std::vector<TensorType> infer_step(const InferContext& ctx) {
  QG_CHECK(ctx.inputs[0].dtype == DType::f32 || ctx.inputs[0].dtype == DType::f64, ctx.op,
           "param must be f32 or f64, got ", ctx.inputs[0].str());
  const TensorType &p = ctx.inputs[0], &g = ctx.inputs[1];
  const bool narrow = p.dtype == DType::f32 && (g.dtype == DType::bf16 || g.dtype == DType::f16);
  QG_CHECK(g.shape == p.shape && (g.dtype == p.dtype || narrow), ctx.op, "grad ", g.str(),
           " must match param ", p.str(), " (or be its bf16/f16 form for an f32 param)");
  return {};
}

// Calls fn(G{}) with G the gradient's element type: T's, or bf16/f16 under an f32 T.
template <typename T, typename Fn>
void with_grad_type(const KernelContext& ctx, Fn&& fn) {
  const DType g = ctx.inputs[1].dtype();
  if constexpr (std::is_same_v<T, float>) {
    if (g == DType::bf16) return fn(bf16{});
    if (g == DType::f16) return fn(f16{});
  }
  QG_CHECK(g == DTypeOf<T>::value, ctx.op, "grad ", ctx.inputs[1].str(), " for a ",
           dtype_name(DTypeOf<T>::value), " param");
  fn(T{});
}

template <typename T>
void sgd_cpu(KernelContext& ctx) {
  with_grad_type<T>(ctx, [&](auto gtag) {
    const auto* g = ctx.inputs[1].data<decltype(gtag)>();
    sgd_update<T>(ctx, ctx.args<SgdArgs>(), ctx.inputs[1],
                  [g](int64_t i) { return cast_element<T>(g[i]); });
  });
}

template <typename T>
void adam_cpu(KernelContext& ctx) {
  with_grad_type<T>(ctx, [&](auto gtag) {
    const auto* g = ctx.inputs[1].data<decltype(gtag)>();
    adam_update<T>(ctx, ctx.args<AdamArgs>(), ctx.inputs[1],
                   [g](int64_t i) { return cast_element<T>(g[i]); });
  });
}

template <template <typename> class K>
KernelFn by_dtype() {
  return [](KernelContext& ctx) {
    if (ctx.inputs[0].dtype() == DType::f64)
      K<double>::run(ctx);
    else
      K<float>::run(ctx);
  };
}
template <typename T>
struct SgdKernel {
  static void run(KernelContext& ctx) { sgd_cpu<T>(ctx); }
};
template <typename T>
struct AdamKernel {
  static void run(KernelContext& ctx) { adam_cpu<T>(ctx); }
};

void define_sgd(OpRegistry& r) {
  OpDef& op = r.define("sgd");
  op.doc = "SGD step with momentum (PyTorch torch.optim.SGD); updates param in place.";
  op.inputs = {"param", "grad"};
  op.attrs = {positive_real("lr", 0.01, "learning rate"),
              bounded_real("momentum", 0.0, "momentum factor", 0.0, 1.0, true),
              bounded_real("dampening", 0.0, "dampening of the momentum", 0.0, 1.0, false),
              bounded_real("weight_decay", 0.0, "L2 penalty", 0.0, 1e30, false),
              bool_attr("nesterov", false, "Nesterov momentum")};
  op.infer = [](const InferContext& ctx) {
    bool nesterov = ctx.attrs.get_bool("nesterov");
    QG_CHECK(!nesterov ||
                 (ctx.attrs.get_real("momentum") > 0.0 && ctx.attrs.get_real("dampening") == 0.0),
             ctx.op, "nesterov needs momentum > 0 and dampening = 0 (got momentum ",
             ctx.attrs.get_real("momentum"), ", dampening ", ctx.attrs.get_real("dampening"), ")");
    return infer_step(ctx);
  };
  op.states = [](const InferContext& ctx) {
    return std::vector<StateSpec>{{"momentum_buffer", ctx.inputs[0], 0.0},
                                  {"step", {DType::i64, {1}}, 0.0}};
  };
  op.side_effects = true;
  op.parse_args = parse_sgd_args;
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, by_dtype<SgdKernel>()});
}

void define_adam(OpRegistry& r) {
  OpDef& op = r.define("adam");
  op.doc = "Adam step (PyTorch torch.optim.Adam, amsgrad off); updates param in place.";
  op.inputs = {"param", "grad"};
  op.attrs = {positive_real("lr", 1e-3, "learning rate"),
              bounded_real("beta1", 0.9, "first-moment decay", 0.0, 1.0, true),
              bounded_real("beta2", 0.999, "second-moment decay", 0.0, 1.0, true),
              positive_real("eps", 1e-8, "denominator term"),
              bounded_real("weight_decay", 0.0, "L2 penalty", 0.0, 1e30, false)};
  op.infer = infer_step;
  op.states = [](const InferContext& ctx) {
    return std::vector<StateSpec>{{"exp_avg", ctx.inputs[0], 0.0},
                                  {"exp_avg_sq", ctx.inputs[0], 0.0},
                                  {"step", {DType::i64, {1}}, 0.0}};
  };
  op.side_effects = true;
  op.parse_args = parse_adam_args;
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, by_dtype<AdamKernel>()});
  op.fusion_rules = {grad_cast_fusion_rule()};
}

}  // namespace

void add_optim_cuda_kernels(OpRegistry& r);  // optim_cuda.cu
void define_adamw(OpRegistry& r);            // adamw_op.cpp
void define_clip_grad_norm(OpRegistry& r);   // clip_grad_norm_op.cpp

void define_optim_ops(OpRegistry& r) {
  define_sgd(r);
  define_adam(r);
  define_adamw(r);
  define_clip_grad_norm(r);
#ifdef QG_WITH_CUDA
  add_optim_cuda_kernels(r);
#endif
}

}  // namespace qg
