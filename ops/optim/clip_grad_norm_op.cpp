// clip_grad_norm(grads...) -> (total_norm, clip_coef): the global gradient-norm clipping of
// torch.nn.utils.clip_grad_norm_ (norm_type 2) as one node over every parameter gradient,
// producing two f32 scalars on the device; each adamw node reads clip_coef as its grad_scale,
// so the gradients are scaled inside the update and nothing waits for the host.
//
// Arithmetic, following torch's structure so that the results agree bit for bit whenever
// torch's per-tensor norm is correctly rounded:
//   norm_k      = f32(sqrt(sum of grad_k[i]^2)), the sum accumulated in f64 (torch.norm of
//                 each gradient, an f32 tensor);
//   total_norm  = f32(sqrt(sum of norm_k^2)), in f64 over the f32 norms in input order
//                 (torch.norm of the stacked norms);
//   clip_coef   = min(f32(1 / (total_norm + f32(1e-6))) * f32(max_norm), 1)
//                 (torch evaluates max_norm / t as t.reciprocal() * max_norm, then clamps).
// The CPU sums each gradient in element order; the CUDA kernel sums fixed slices per block
// and adds the partial sums in a fixed order, so both are deterministic and differ only by
// f64 rounding before the round to f32.
//
// A non-finite total norm is an error, as torch's error_if_nonfinite = True: the CPU kernel
// throws; the CUDA kernel records a device error (raised when the step synchronises) and
// outputs a NaN clip_coef, on which every adamw node skips its update.
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/optim/optim_args.h"
#include "ops/optim/optim_attrs.h"

namespace qg {
namespace {

std::vector<TensorType> infer_clip(const InferContext& ctx) {
  for (size_t k = 0; k < ctx.inputs.size(); ++k)
    QG_CHECK(ctx.inputs[k].dtype == DType::f32 || ctx.inputs[k].dtype == DType::f64, ctx.op,
             "gradient ", k, " must be f32 or f64, got ", ctx.inputs[k].str());
  return {TensorType{DType::f32, {}}, TensorType{DType::f32, {}}};
}

template <typename T>
double sum_of_squares(const Tensor& t) {
  const T* x = t.data<T>();
  double s = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i)
    s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

void clip_grad_norm_cpu(KernelContext& ctx) {
  double total_sq = 0.0;
  for (const Tensor& g : ctx.inputs) {
    QG_CHECK(g.is_contiguous(), ctx.op, "gradients must be contiguous");
    const double s = g.dtype() == DType::f64 ? sum_of_squares<double>(g) : sum_of_squares<float>(g);
    const double norm = static_cast<float>(std::sqrt(s));
    total_sq += norm * norm;
  }
  const float total = static_cast<float>(std::sqrt(total_sq));
  QG_CHECK(std::isfinite(total), ctx.op, "the total gradient norm of ", ctx.inputs.size(),
           " gradients is ", total,
           " (not finite), so it cannot be clipped; the step was skipped (error_if_nonfinite)");
  const float max_norm = static_cast<float>(ctx.args<ClipGradNormArgs>().max_norm);
  const float coef = (1.0f / (total + 1e-6f)) * max_norm;
  ctx.outputs[0].data<float>()[0] = total;
  ctx.outputs[1].data<float>()[0] = coef < 1.0f ? coef : 1.0f;
}

}  // namespace

void add_clip_grad_norm_cuda_kernel(OpRegistry& r);  // clip_grad_norm_cuda.cu

void define_clip_grad_norm(OpRegistry& r) {
  OpDef& op = r.define("clip_grad_norm");
  op.doc =
      "Global L2 norm of all gradients and the clip coefficient min(max_norm / (norm + 1e-6), "
      "1) of torch.nn.utils.clip_grad_norm_; adamw reads the coefficient as its grad_scale.";
  op.inputs = {"grads"};
  op.variadic = true;
  op.outputs = {"total_norm", "clip_coef"};
  op.attrs = {optim_attrs::positive_real("max_norm", 1.0, "largest total gradient norm")};
  op.infer = infer_clip;
  op.parse_args = parse_clip_grad_norm_args;
  op.kernels.push_back({DeviceType::cpu, kF32F64DTypes, clip_grad_norm_cpu});
#ifdef QG_WITH_CUDA
  add_clip_grad_norm_cuda_kernel(r);
#endif
}

}  // namespace qg
