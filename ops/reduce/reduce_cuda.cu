// CUDA kernels for sum and mean: a deterministic two-pass reduction accumulated in f64 (as
// the CPU accumulates), so repeated runs give the same bits; CPU and GPU agree to rounding
// of the f64 sums (the crosscheck's 1e-5 relative bound for float reductions).
#include "core/graph.h"
#include "ops/common/cuda_shape.cuh"
#include "ops/common/schema_helpers.h"
#include "ops/reduce/reduce_args.h"

namespace qg {
namespace {

using namespace cuda;

void reduce_cuda(KernelContext& ctx, bool mean) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  const Shape& keep = ctx.args<ReduceArgs>().keep;
  double count = y.numel() == 0 ? 0.0 : static_cast<double>(x.numel()) / y.numel();
  dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
    launch_reduce<decltype(tag)>(ctx.op, x, keep, mean, count, y, cuda_stream(ctx.device));
  });
}

}  // namespace

void add_reduce_cuda_kernels(OpRegistry& r) {
  r.get_mutable("sum").kernels.push_back(
      {DeviceType::cuda, kFloatDTypes, [](KernelContext& c) { reduce_cuda(c, false); }});
  r.get_mutable("mean").kernels.push_back(
      {DeviceType::cuda, kFloatDTypes, [](KernelContext& c) { reduce_cuda(c, true); }});
}

}  // namespace qg
