// CUDA kernels for permute and transpose: a strided gather, one thread per output element,
// over the collapsed plan of permute_plan.h (at most kMaxRank dimensions after merging), and
// for plans that are a (batched) swap of the last two axes, a 32 x 32 shared-memory tile
// transpose so that both the reads and the writes are coalesced. Elements move as unsigned
// integers of their size (or as 16-byte units when whole innermost runs move together), so
// every dtype is bit-exact with the CPU copy.
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

// I: uint32_t when every element offset fits (a 32-bit division costs a fraction of a
// 64-bit one, and there is one per dimension per element), else int64_t.
template <typename E, typename I>
__global__ void permute_gather_kernel(const E* __restrict__ src, E* __restrict__ dst, int64_t n64,
                                      GatherDims g) {
  const I n = static_cast<I>(n64);
  const I stride = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I k = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + threadIdx.x; k < n;
       k += stride) {
    I rest = k, off = 0;
    for (int d = g.rank - 1; d >= 0; --d) {
      const I size = static_cast<I>(g.sizes[d]);
      const I i = rest % size;
      rest /= size;
      off += i * static_cast<I>(g.src_strides[d]);
    }
    dst[k] = src[off];
  }
}

constexpr int kTile = 32, kTileRows = 8;

// out[b] = in[b]^T for `batches` row-major [rows, cols] matrices. Block (32, 8) moves one
// 32 x 32 tile through shared memory (padded by one column against bank conflicts).
template <typename E>
__global__ void transpose_tiles_kernel(const E* src, E* dst, int64_t batches, int64_t rows,
                                       int64_t cols) {
  __shared__ E tile[kTile][kTile + 1];
  const int64_t c0 = int64_t{blockIdx.x} * kTile, r0 = int64_t{blockIdx.y} * kTile;
  for (int64_t b = blockIdx.z; b < batches; b += gridDim.z) {
    const E* in = src + b * rows * cols;
    E* out = dst + b * rows * cols;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[j][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (c < cols && r < rows) out[c * rows + r] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

// A plan {[batches,] cols, rows} reading strides {[rows * cols,] 1, cols} is a batched
// transpose of [rows, cols] matrices. Small matrices stay with the gather.
bool as_tiled_transpose(const PermutePlan& p, int64_t& batches, int64_t& rows, int64_t& cols) {
  const size_t r = p.sizes.size();
  if (r < 2 || r > 3) return false;
  cols = p.sizes[r - 2];
  rows = p.sizes[r - 1];
  batches = r == 3 ? p.sizes[0] : 1;
  if (p.src_strides[r - 2] != 1 || p.src_strides[r - 1] != cols) return false;
  if (r == 3 && p.src_strides[0] != rows * cols) return false;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  return rows >= kTile / 2 && cols >= kTile / 2 && row_tiles <= 65535;
}

template <typename E>
void launch_tiles(KernelContext& ctx, int64_t batches, int64_t rows, int64_t cols) {
  dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
            static_cast<unsigned>((rows + kTile - 1) / kTile),
            static_cast<unsigned>(batches < 65535 ? batches : 65535));
  transpose_tiles_kernel<E>
      <<<grid, dim3(kTile, kTileRows), 0, static_cast<cudaStream_t>(ctx.stream)>>>(
          in_ptr<E>(ctx.inputs[0]), out_ptr<E>(ctx.outputs[0]), batches, rows, cols);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
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
void launch_gather(KernelContext& ctx, const PermutePlan& plan, const GatherDims& g, int64_t n) {
  int64_t batches = 0, rows = 0, cols = 0;
  if (as_tiled_transpose(plan, batches, rows, cols))
    return launch_tiles<E>(ctx, batches, rows, cols);
  auto shape = elementwise_launch(n);
  auto go = [&](auto kernel) {
    kernel<<<shape.blocks, shape.threads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
        static_cast<const E*>(ctx.inputs[0].raw_data()), static_cast<E*>(ctx.outputs[0].raw_data()),
        n, g);
  };
  // Offsets are below n (a permutation), so 32 bits suffice whenever n does.
  if (n < (int64_t{1} << 31))
    go(permute_gather_kernel<E, uint32_t>);
  else
    go(permute_gather_kernel<E, int64_t>);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

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
  int64_t units = n;
  if (as_16_byte_units(ctx, dtype_size(x.dtype()), plan, g, units))
    return launch_gather<uint4>(ctx, plan, g, units);
  switch (dtype_size(x.dtype())) {
    case 1:
      return launch_gather<uint8_t>(ctx, plan, g, n);
    case 2:
      return launch_gather<uint16_t>(ctx, plan, g, n);
    case 4:
      return launch_gather<uint32_t>(ctx, plan, g, n);
    case 8:
      return launch_gather<uint64_t>(ctx, plan, g, n);
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
