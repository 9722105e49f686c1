// cast: y = x converted to the float dtype named by the attribute `dtype` (f32, f64, f16,
// bf16), as torch's Tensor.to(dtype). Narrowing rounds to nearest, ties to even; f64 reaches
// f16/bf16 through f32 (two roundings, which is what torch's conversions do); NaN stays NaN
// and infinities stay infinite. The gradient is cast back to x's dtype.
#include "core/graph.h"
#include "core/strided_layout.h"
#include "core/thread_pool.h"
#include "ops/cast/cast_element.h"
#include "ops/common/schema_helpers.h"

namespace qg {
namespace {

void cast_cpu(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  dispatch_float(x.dtype(), "cast", [&](auto src) {
    using Src = decltype(src);
    dispatch_float(y.dtype(), "cast", [&](auto dst) {
      using Dst = decltype(dst);
      const Src* in = x.data<Src>();
      Dst* out = y.data<Dst>();
      const StridedLayout from = strided_layout("cast", x);
      parallel_for(x.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
        if (from.contiguous)
          for (int64_t i = begin; i < end; ++i) out[i] = cast_element<Dst>(in[i]);
        else
          for (int64_t i = begin; i < end; ++i) out[i] = cast_element<Dst>(in[from.offset(i)]);
      });
    });
  });
}

}  // namespace

void add_cast_cuda_kernels(OpRegistry& r);  // cast_cuda.cu

void add_cast_crosscheck(OpRegistry& r);  // cast_crosscheck.cpp

void define_cast_ops(OpRegistry& r) {
  OpDef& op = r.define("cast");
  op.doc = "y = x converted to `dtype` (round to nearest even; NaN and infinities kept).";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {
      string_attr("dtype", std::nullopt, {"f32", "f64", "f16", "bf16"}, "the float dtype of y")};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    DType to = dtype_from_name(ctx.attrs.get_string("dtype"));
    return std::vector<TensorType>{{to, ctx.inputs[0].shape}};
  };
  op.parse_args = no_kernel_args;  // the target dtype is the output's
  // Reads x through its strides: casting a transposed or sliced view makes it contiguous.
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, cast_cpu, /*strided=*/true});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const DType from = c.graph.value(c.node.inputs[0]).type.dtype;
    return {c.graph.apply1("cast", {c.grad_or_zeros(0)}, {{"dtype", dtype_name(from)}})};
  };
  // The harness differentiates in f64, so the sample is f64 -> f64; the narrowing casts'
  // gradients are cast back exactly as the forward runs, tested in tests/ops_cast.
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{{"f64 -> f64 [3,5]", {{{3, 5}}}, {{"dtype", "f64"}}}};
  };
#ifdef QG_WITH_CUDA
  add_cast_cuda_kernels(r);
#endif
  add_cast_crosscheck(r);
}

}  // namespace qg
