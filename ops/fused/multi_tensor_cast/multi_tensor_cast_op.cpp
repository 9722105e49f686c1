// fused_multi_tensor_cast(param_0, ..., param_{n-1}) -> (copy_0, ..., copy_{n-1}): the casts of
// n parameters to one narrower dtype (a mixed-precision step's bf16 compute copies of its f32
// weights), made into one node by the fuse_multi_tensor_cast pass. On CUDA the n casts run as
// one launch per kMultiCastChunk tensors (multi_tensor_cast_cuda.cu) instead of one launch per
// weight: the 207M Llama step casts 85 weights of 0.5 to 33 million elements, where a launch
// each cost about 3x the bytes' time. The CPU kernel runs each part's own cast kernel, and the
// CUDA kernel converts each element as the cast kernel does, so the copies are the unfused
// casts' bit for bit.
#include "ops/fused/multi_tensor_cast/multi_tensor_cast.h"

#include "core/error.h"
#include "core/graph.h"
#include "ops/fused/common/run_original_kernel.h"

namespace qg {

void check_multi_tensor_cast_inputs(const KernelContext& ctx) {
  const size_t parts = ctx.num_parts();
  QG_CHECK(parts >= 1 && ctx.inputs.size() == parts && ctx.outputs.size() == parts, ctx.op,
           ctx.inputs.size(), " inputs and ", ctx.outputs.size(), " outputs for ", parts,
           " cast parts; expected one of each per part");
  const DType from = ctx.inputs[0].dtype(), to = ctx.outputs[0].dtype();
  for (size_t k = 0; k < parts; ++k) {
    QG_CHECK(ctx.part(k).op->name == "cast", ctx.op, "part ", k, " is a ", ctx.part(k).op->name,
             ", not a cast");
    const Tensor& x = ctx.inputs[k];
    const Tensor& y = ctx.outputs[k];
    QG_CHECK(x.dtype() == from && y.dtype() == to && x.shape() == y.shape(), ctx.op, "part ", k,
             ": input ", x.str(), " and output ", y.str(), " must be ", dtype_name(from), " and ",
             dtype_name(to), " of one shape");
    QG_CHECK(x.is_contiguous() && y.is_contiguous(), ctx.op, "part ", k,
             ": input and output must be contiguous");
  }
}

namespace {

void multi_tensor_cast_cpu(KernelContext& ctx) {
  check_multi_tensor_cast_inputs(ctx);
  std::vector<Tensor> no_states;
  for (size_t k = 0; k < ctx.num_parts(); ++k)
    ctx.outputs[k] =
        run_original_kernel(ctx.op, ctx.part(k), DeviceType::cpu, ctx.inputs[k].dtype(),
                            {ctx.inputs[k]}, {ctx.outputs[k]}, no_states, ctx)[0];
}

}  // namespace

#ifdef QG_WITH_CUDA
void add_fused_multi_tensor_cast_cuda_kernel(OpRegistry& r);  // multi_tensor_cast_cuda.cu
#endif

void define_fused_multi_tensor_cast_op(OpRegistry& r) {
  OpDef& op = r.define("fused_multi_tensor_cast");
  op.doc =
      "The casts of several parameters to one dtype, fused by the fuse_multi_tensor_cast pass: "
      "input i is parameter i, output i its cast.";
  op.inputs = {"params"};
  op.outputs = {"copies"};
  op.variadic = true;
  op.infer = [](const InferContext& ctx) -> std::vector<TensorType> {
    QG_FAIL(ctx.op, "fused nodes are created by the fuse_multi_tensor_cast pass, not by apply()");
  };
  op.is_source = false;
  op.kernels.push_back({DeviceType::cpu, {}, multi_tensor_cast_cpu});
#ifdef QG_WITH_CUDA
  add_fused_multi_tensor_cast_cuda_kernel(r);
#endif
  op.fusion_rules = {multi_tensor_cast_fusion_rule()};
}

}  // namespace qg
