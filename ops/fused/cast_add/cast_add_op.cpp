// fused_cast_add(a, b) -> y (f32): y = f32(a) + f32(b), element by element in row-major order,
// where a and b may each be f32, bf16 or f16. Made by the fuse_cast_add pass from an f32 add
// whose operands come from widening casts (through reshape views), which a bf16 mixed-precision
// step has everywhere a bf16 GEMM result meets the f32 stream:
//   - forward, the residual add of the attention and MLP outputs (bf16 -> f32, then added);
//   - backward, the sums of the input gradients of the q/k/v and gate/up projections (each a
//     bf16 GEMM result widened, then accumulated in f32).
// The unfused graph writes each widened copy (4 bytes an element) and reads it back; the fused
// node reads the 2-byte operand once. Bit for bit the same: widening bf16/f16 to f32 is exact
// (NaN payloads kept), and the f32 add is the one rounding either way.
#include <algorithm>

#include "core/error.h"
#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/cast/cast_element.h"
#include "ops/fused/cast_add/cast_add.h"

namespace qg {

void check_fused_cast_add_inputs(const KernelContext& ctx) {
  QG_CHECK(ctx.inputs.size() == 2 && ctx.outputs.size() == 1, ctx.op,
           "takes inputs {a, b} and output {y}, got ", ctx.inputs.size(), " inputs and ",
           ctx.outputs.size(), " outputs");
  const Tensor& y = ctx.outputs[0];
  QG_CHECK(y.dtype() == DType::f32 && y.is_contiguous(), ctx.op,
           "y must be a contiguous f32 tensor, got ", y.str());
  for (size_t i = 0; i < 2; ++i) {
    const Tensor& t = ctx.inputs[i];
    const DType d = t.dtype();
    QG_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16, ctx.op, "input ",
             i == 0 ? "a" : "b", " ", t.str(),
             " must be f32, bf16 or f16 (widened exactly to f32)");
    QG_CHECK(t.numel() == y.numel() && t.is_contiguous(), ctx.op, "input ", i == 0 ? "a" : "b", " ",
             t.str(), " must be contiguous with y's ", y.numel(),
             " elements (the fused add does not broadcast)");
  }
}

namespace {

template <typename A, typename B>
void add_typed(const Tensor& a, const Tensor& b, Tensor& y) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  float* py = y.data<float>();
  parallel_for(y.numel(), kElementGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) py[i] = cast_element<float>(pa[i]) + cast_element<float>(pb[i]);
  });
}

void fused_cast_add_cpu(KernelContext& ctx) {
  check_fused_cast_add_inputs(ctx);
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(), [&](auto ta) {
    dispatch_float(ctx.inputs[1].dtype(), ctx.op.c_str(), [&](auto tb) {
      add_typed<decltype(ta), decltype(tb)>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]);
    });
  });
}

}  // namespace

void define_fused_cast_add_op(OpRegistry& r) {
  OpDef& op = r.define("fused_cast_add");
  op.doc =
      "An f32 add and the widening casts (bf16/f16 -> f32) of its operands, through reshape "
      "views, fused by the fuse_cast_add pass: y = f32(a) + f32(b), no broadcasting.";
  op.inputs = {"a", "b"};
  op.outputs = {"y"};
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_cast_add pass, not by apply()");
  };
  op.is_source = false;
  // The executor picks a kernel by the first input's dtype; the kernels dispatch on both.
  op.kernels.push_back(
      {DeviceType::cpu, {DType::f32, DType::f16, DType::bf16}, fused_cast_add_cpu});
  op.fusion_rules = {cast_add_fusion_rule()};
}

}  // namespace qg
