// CUDA kernel for permute and transpose: a strided gather, one thread per output element,
// over the collapsed plan of permute_plan.h (at most kMaxRank dimensions after merging). The
// element is moved as an unsigned integer of its size, so every dtype is bit-exact with the
// CPU copy.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/schema_helpers.h"
#include "ops/shape/permute_plan.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kMaxRank = 6;

struct GatherDims {
  int rank;
  int64_t sizes[kMaxRank];
  int64_t src_strides[kMaxRank];
};

template <typename E>
__global__ void permute_gather_kernel(const E* src, E* dst, int64_t n, GatherDims g) {
  for (int64_t k = global_thread(); k < n; k += global_stride()) {
    int64_t rest = k, off = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t i = rest % g.sizes[d];
      rest /= g.sizes[d];
      off += i * g.src_strides[d];
    }
    dst[k] = src[off];
  }
}

std::vector<int64_t> perm_for(const KernelContext& ctx, int rank) {
  if (ctx.op == "transpose") {
    int d0 = normalize_axis(ctx.op, "dim0", ctx.attrs.get_int("dim0"), rank);
    int d1 = normalize_axis(ctx.op, "dim1", ctx.attrs.get_int("dim1"), rank);
    std::vector<int64_t> perm(rank);
    for (int i = 0; i < rank; ++i) perm[i] = i;
    std::swap(perm[d0], perm[d1]);
    return perm;
  }
  return checked_perm(ctx.op, ctx.attrs.get_ints("perm"), rank);
}

template <typename E>
void launch_gather(KernelContext& ctx, const GatherDims& g, int64_t n) {
  auto shape = elementwise_launch(n);
  permute_gather_kernel<E>
      <<<shape.blocks, shape.threads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
          in_ptr<E>(ctx.inputs[0]), out_ptr<E>(ctx.outputs[0]), n, g);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void permute_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t n = ctx.outputs[0].numel();
  if (n == 0) return;
  PermutePlan plan = make_permute_plan(x.shape(), perm_for(ctx, x.dim()));
  QG_CHECK(plan.sizes.size() <= kMaxRank, ctx.op, "the CUDA kernel gathers at most ", kMaxRank,
           " dimensions after merging contiguous ones; input ", x.str(), " needs ",
           plan.sizes.size());
  GatherDims g{};
  g.rank = static_cast<int>(plan.sizes.size());
  for (int d = 0; d < g.rank; ++d) {
    g.sizes[d] = plan.sizes[d];
    g.src_strides[d] = plan.src_strides[d];
  }
  switch (dtype_size(x.dtype())) {
    case 1:
      return launch_gather<uint8_t>(ctx, g, n);
    case 2:
      return launch_gather<uint16_t>(ctx, g, n);
    case 4:
      return launch_gather<uint32_t>(ctx, g, n);
    case 8:
      return launch_gather<uint64_t>(ctx, g, n);
    default:
      QG_FAIL(ctx.op, "no permute for elements of ", dtype_size(x.dtype()), " bytes (",
              dtype_name(x.dtype()), ")");
  }
}

}  // namespace

void add_shape_cuda_kernels(OpRegistry& r) {
  r.get_mutable("permute").kernels.push_back({DeviceType::cuda, {}, permute_cuda});
  r.get_mutable("transpose").kernels.push_back({DeviceType::cuda, {}, permute_cuda});
}

}  // namespace qg
