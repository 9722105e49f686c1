// The per-element update of the CPU sgd and adam kernels, written once for the plain ops
// (ops/optim/optim_ops.cpp: the gradient is a tensor) and for the fused straight-through
// estimator + step (ops/fused/ste_optimizer/ste_optimizer_op.cpp: the gradient is dy where the
// fake-quantizer's mask bit is set, else +0). `grad_at(i)` yields element i's gradient; every
// float operation after it is this one code, so the fused node updates the parameter bit for
// bit as ste_backward followed by the step does.
#pragma once

#include <cmath>

#include "core/error.h"
#include "core/graph.h"
#include "core/thread_pool.h"
#include "ops/optim/optim_args.h"

namespace qg {

// Runs f(p, i) over every parameter element after checking that the parameter (the
// persistent tensor the update is written to) and the gradient's source are contiguous.
template <typename T, typename F>
void for_each_param_element(KernelContext& ctx, const Tensor& grad_source, F f) {
  Tensor& p = ctx.inputs[0];
  QG_CHECK(p.is_contiguous() && grad_source.is_contiguous(), ctx.op,
           "param and grad must be contiguous");
  T* pp = p.data<T>();
  // Element-wise: chunks of the thread pool, each element updated exactly as on one thread.
  parallel_for(p.numel(), kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(pp[i], i);
  });
}

// SGD with `a` (an sgd node's parsed arguments) and states {momentum_buffer, step}.
template <typename T, typename GradAt>
void sgd_update(KernelContext& ctx, const SgdArgs& a, const Tensor& grad_source, GradAt grad_at) {
  const T lr = static_cast<T>(a.lr);
  const T mom = static_cast<T>(a.momentum);
  // 1 - dampening (and Adam's 1 - beta) are formed in double and rounded once, as PyTorch
  // does with its Python-float hyper-parameters; forming them in f32 from a rounded beta
  // would shift every step by ~1e-7 relative.
  const T one_minus_damp = static_cast<T>(1.0 - a.dampening);
  const T wd = static_cast<T>(a.weight_decay);
  const bool nesterov = a.nesterov;
  T* buf = ctx.states[0].data<T>();
  int64_t& step = ctx.states[1].data<int64_t>()[0];
  const bool first = step == 0;
  for_each_param_element<T>(ctx, grad_source, [&](T& p, int64_t i) {
    T g = grad_at(i);
    if (wd != T(0)) g = g + wd * p;
    if (mom != T(0)) {
      buf[i] = first ? g : mom * buf[i] + one_minus_damp * g;
      g = nesterov ? g + mom * buf[i] : buf[i];
    }
    p = p - lr * g;
  });
  ++step;
}

// One Adam step (torch.optim.Adam; with `decoupled`, torch.optim.AdamW) over states {exp_avg,
// exp_avg_sq, step}: weight decay as L2 into the gradient, or decoupled (p *= 1 - lr * wd,
// that factor formed in double and rounded once, as torch forms it from Python floats).
struct AdamStep {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled = false;
};

template <typename T, typename GradAt>
void adam_step(KernelContext& ctx, const AdamStep& a, const Tensor& grad_source, GradAt grad_at) {
  const T b1 = static_cast<T>(a.beta1);
  const T b2 = static_cast<T>(a.beta2);
  const T one_minus_b1 = static_cast<T>(1.0 - a.beta1);
  const T one_minus_b2 = static_cast<T>(1.0 - a.beta2);
  const T eps = static_cast<T>(a.eps);
  const T wd = a.decoupled ? T(0) : static_cast<T>(a.weight_decay);
  const bool decay_param = a.decoupled && a.weight_decay != 0.0;
  const T decay = static_cast<T>(1.0 - a.lr * a.weight_decay);
  T* m = ctx.states[0].data<T>();
  T* v = ctx.states[1].data<T>();
  int64_t& step = ctx.states[2].data<int64_t>()[0];
  ++step;
  // Bias corrections in double, as PyTorch computes them on the host from a Python float.
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(step));
  const T step_size = static_cast<T>(a.lr / bc1);
  const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  for_each_param_element<T>(ctx, grad_source, [&](T& p, int64_t i) {
    T g = grad_at(i);
    if (wd != T(0)) g = g + wd * p;
    if (decay_param) p = p * decay;
    m[i] = b1 * m[i] + one_minus_b1 * g;
    v[i] = b2 * v[i] + one_minus_b2 * (g * g);
    T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p = p - step_size * (m[i] / denom);
  });
}

// Adam with `a` (an adam node's parsed arguments).
template <typename T, typename GradAt>
void adam_update(KernelContext& ctx, const AdamArgs& a, const Tensor& grad_source, GradAt grad_at) {
  adam_step<T>(ctx, AdamStep{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, false}, grad_source,
               grad_at);
}

}  // namespace qg
