// The SwiGLU of a Llama MLP as two fused nodes, made by the fuse_swiglu pass from the graph's
// silu, mul and silu_backward nodes:
//   fused_swiglu(gate, up) -> h:                  s = T(silu(gate)); h = T(s * up)
//   fused_swiglu_backward(dh, gate, up) -> (dgate, dup):
//                                                  s = T(silu(gate)) (recomputed);
//                                                  dup = T(dh * s); ds = T(dh * up);
//                                                  dgate = T(ds * silu'(gate))
// each product and function in the math type (f32 for 16-bit T) and rounded to T where the
// unfused nodes round, so both equal the unfused graph bit for bit on each backend (the CPU's
// exp is libm's, CUDA's expf: the backends differ as the plain silu does). The unfused graph
// writes s (and keeps it for the backward) and ds and reads each back: for the 207M Llama's
// [8192, 2816] bf16 activations, 276 MB a layer and a step more than the fused pair moves,
// and s is 46 MB a layer that the step no longer holds from the forward to the backward.
#include "ops/fused/swiglu/swiglu.h"

#include "core/error.h"
#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/activation/activation_math.h"

namespace qg {

void check_fused_swiglu_tensors(const KernelContext& ctx) {
  const Tensor& first = ctx.inputs.at(0);
  QG_CHECK(is_floating(first.dtype()), ctx.op, "takes float tensors, got ", first.str());
  auto check = [&](const Tensor& t, const char* what, size_t i) {
    QG_CHECK(t.dtype() == first.dtype() && t.numel() == first.numel() && t.is_contiguous(), ctx.op,
             what, " ", i, " ", t.str(), " must be contiguous with the dtype and the ",
             first.numel(), " elements of input 0 ", first.str());
  };
  for (size_t i = 0; i < ctx.inputs.size(); ++i) check(ctx.inputs[i], "input", i);
  for (size_t i = 0; i < ctx.outputs.size(); ++i) check(ctx.outputs[i], "output", i);
}

namespace {

// The unfused nodes' element math: silu's, mul's and silu_backward's CPU kernels
// (cpu::unary_float / binary_float: evaluate in M, round to T).
template <typename T>
void swiglu_cpu_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const T* g = ctx.inputs[0].data<T>();
  const T* u = ctx.inputs[1].data<T>();
  T* h = ctx.outputs[0].data<T>();
  parallel_for(ctx.outputs[0].numel(), kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T s = static_cast<T>(act::silu(static_cast<M>(g[i])));
      h[i] = static_cast<T>(static_cast<M>(s) * static_cast<M>(u[i]));
    }
  });
}

template <typename T>
void swiglu_backward_cpu_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const T* dh = ctx.inputs[0].data<T>();
  const T* g = ctx.inputs[1].data<T>();
  const T* u = ctx.inputs[2].data<T>();
  T* dg = ctx.outputs[0].data<T>();
  T* du = ctx.outputs[1].data<T>();
  parallel_for(ctx.outputs[0].numel(), kElementGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T s = static_cast<T>(act::silu(static_cast<M>(g[i])));
      const T ds = static_cast<T>(static_cast<M>(dh[i]) * static_cast<M>(u[i]));
      du[i] = static_cast<T>(static_cast<M>(dh[i]) * static_cast<M>(s));
      dg[i] = static_cast<T>(static_cast<M>(ds) * act::silu_grad(static_cast<M>(g[i])));
    }
  });
}

void define(OpRegistry& r, const char* name, const char* doc, std::vector<std::string> inputs,
            std::vector<std::string> outputs, KernelFn cpu) {
  OpDef& op = r.define(name);
  op.doc = doc;
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_swiglu pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, std::move(cpu)});
}

}  // namespace

#ifdef QG_WITH_CUDA
void add_fused_swiglu_cuda_kernels(OpRegistry& r);  // swiglu_cuda.cu
#endif

void define_fused_swiglu_ops(OpRegistry& r) {
  define(r, "fused_swiglu",
         "silu(gate) * up, fused by the fuse_swiglu pass (each step rounded as the unfused "
         "silu and mul round).",
         {"gate", "up"}, {"h"}, [](KernelContext& ctx) {
           check_fused_swiglu_tensors(ctx);
           dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                          [&](auto tag) { swiglu_cpu_typed<decltype(tag)>(ctx); });
         });
  define(r, "fused_swiglu_backward",
         "dgate and dup of silu(gate) * up from dh, gate and up (silu recomputed), fused by the "
         "fuse_swiglu pass.",
         {"dh", "gate", "up"}, {"dgate", "dup"}, [](KernelContext& ctx) {
           check_fused_swiglu_tensors(ctx);
           dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                          [&](auto tag) { swiglu_backward_cpu_typed<decltype(tag)>(ctx); });
         });
  r.get_mutable("fused_swiglu").fusion_rules = {swiglu_fusion_rule()};
#ifdef QG_WITH_CUDA
  add_fused_swiglu_cuda_kernels(r);
#endif
}

}  // namespace qg
