// CUDA kernels for permute and transpose: the gathers of permute_gather.cuh (a strided gather
// over the collapsed plan of permute_plan.h, or a 32 x 32 shared-memory tile transpose for a
// batched swap of the last two axes). Elements move as unsigned integers of their size (or as
// 16-byte units when whole innermost runs move together), so every dtype is bit-exact with
// the CPU copy.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/shape/permute_gather.cuh"
#include "ops/shape/permute_plan.h"

namespace qg {
namespace {

using namespace cuda;

// When the innermost axis stays innermost and its run (and every stride) is a whole number
// of 16-byte units on aligned buffers, the permutation moves 16-byte units: the same bytes
// with a fraction of the index arithmetic (attention's head split and merge move runs of
// 64 f32). Rewrites plan and g in units of 16 bytes; false when it does not apply.
bool as_16_byte_units(const KernelContext& ctx, int64_t elem_size, PermutePlan& plan, GatherDims& g,
                      int64_t& n) {
  const size_t r = plan.sizes.size();
  if (r < 2 || plan.src_strides[r - 1] != 1 || (plan.sizes[r - 1] * elem_size) % 16 != 0 ||
      !aligned16(ctx.inputs[0].raw_data()) || !aligned16(ctx.outputs[0].raw_data()))
    return false;
  for (size_t d = 0; d + 1 < r; ++d)
    if ((plan.src_strides[d] * elem_size) % 16 != 0) return false;
  const int64_t per_unit = 16 / elem_size;  // elem_size divides 16 (1, 2, 4 or 8 bytes)
  plan.sizes[r - 1] /= per_unit;
  for (size_t d = 0; d + 1 < r; ++d) plan.src_strides[d] /= per_unit;
  for (size_t d = 0; d < r; ++d) {
    g.sizes[d] = plan.sizes[d];
    g.src_strides[d] = plan.src_strides[d];
  }
  n /= per_unit;
  return true;
}

void permute_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t n = ctx.outputs[0].numel();
  if (n == 0) return;
  // A copy (rewritten in 16-byte units), over x's own strides when x is a strided view.
  PermutePlan plan = permute_plan_of(ctx.args<PermuteArgs>(), x);
  GatherDims g = gather_dims(ctx.op, plan, x);
  int64_t units = n;
  if (as_16_byte_units(ctx, dtype_size(x.dtype()), plan, g, units))
    return launch_gather<uint4>(ctx, plan, g, units, PlainStore{});
  switch (dtype_size(x.dtype())) {
    case 1:
      return launch_gather<uint8_t>(ctx, plan, g, n, PlainStore{});
    case 2:
      return launch_gather<uint16_t>(ctx, plan, g, n, PlainStore{});
    case 4:
      return launch_gather<uint32_t>(ctx, plan, g, n, PlainStore{});
    case 8:
      return launch_gather<uint64_t>(ctx, plan, g, n, PlainStore{});
    default:
      QG_FAIL(ctx.op, "no permute for elements of ", dtype_size(x.dtype()), " bytes (",
              dtype_name(x.dtype()), ")");
  }
}

}  // namespace

void add_shape_cuda_kernels(OpRegistry& r) {
  const KernelDef gather{DeviceType::cuda, {}, permute_cuda, /*strided=*/true};
  r.get_mutable("permute").kernels.push_back(gather);
  r.get_mutable("transpose").kernels.push_back(gather);
}

}  // namespace qg
