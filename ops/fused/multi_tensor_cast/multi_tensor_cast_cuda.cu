// The CUDA kernel of fused_multi_tensor_cast: the parts' tensors in tables of up to
// kMultiCastChunk (passed by value as kernel parameters, so nothing is copied to the device and
// a CUDA graph captures them as they are), one launch per table. Each block converts
// kPacksPerBlock packs of 8 elements of one tensor (16-byte loads and stores where both ends
// are 16-byte aligned); the block-to-tensor map is a prefix sum of the tensors' block counts.
// Each element is converted as the cast kernel converts it (ops/cast/cast_cuda.cu), so the
// copies are the unfused casts' bit for bit.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/cuda_vec.cuh"
#include "ops/fused/multi_tensor_cast/multi_tensor_cast.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;
constexpr int64_t kPacksPerBlock = 4 * kThreads;

template <typename Src, typename Dst>
struct CastTable {
  const Src* x[kMultiCastChunk];
  Dst* y[kMultiCastChunk];
  int64_t n[kMultiCastChunk];
  int64_t first_block[kMultiCastChunk + 1];  // prefix sum of the tensors' blocks
  bool vec[kMultiCastChunk];
  int count;
};

template <typename Dst, typename Src>
__device__ __forceinline__ Dst convert(Src v) {
  return from_math<Dst>(static_cast<math_of<Dst>>(to_math(v)));
}

template <typename Src, typename Dst>
__global__ void __launch_bounds__(kThreads) multi_cast_kernel(CastTable<Src, Dst> t) {
  const int64_t block = blockIdx.x;
  int k = 0;
  while (k + 1 < t.count && t.first_block[k + 1] <= block) ++k;
  const Src* x = t.x[k];
  Dst* y = t.y[k];
  const int64_t n = t.n[k], packs = n / 8;
  const int64_t begin = (block - t.first_block[k]) * kPacksPerBlock;
  const int64_t end = begin + kPacksPerBlock < packs ? begin + kPacksPerBlock : packs;
  for (int64_t p = begin + threadIdx.x; p < end; p += kThreads) {
    const Pack8<Src> v = load_pack(x, p, t.vec[k]);
    Pack8<Dst> r;
#pragma unroll
    for (int j = 0; j < 8; ++j) r.v[j] = convert<Dst>(v.v[j]);
    store_pack(y, p, t.vec[k], r);
  }
  // The tail of fewer than 8 elements: the tensor's last block.
  if (threadIdx.x == 0 && block + 1 == t.first_block[k + 1])
    for (int64_t i = packs * 8; i < n; ++i) y[i] = convert<Dst>(x[i]);
}

template <typename Src, typename Dst>
void launch(KernelContext& ctx) {
  const size_t parts = ctx.num_parts();
  auto stream = cuda_stream(ctx.device);
  for (size_t first = 0; first < parts; first += kMultiCastChunk) {
    CastTable<Src, Dst> t{};
    t.count = static_cast<int>(std::min<size_t>(kMultiCastChunk, parts - first));
    t.first_block[0] = 0;
    for (int j = 0; j < t.count; ++j) {
      const size_t k = first + static_cast<size_t>(j);
      t.x[j] = in_ptr<Src>(ctx.inputs[k]);
      t.y[j] = out_ptr<Dst>(ctx.outputs[k]);
      t.n[j] = ctx.inputs[k].numel();
      t.vec[j] = aligned16(t.x[j]) && aligned16(t.y[j]);
      // At least one block a tensor, so that its tail (and a tensor of under 8 elements) has one.
      const int64_t blocks = (t.n[j] / 8 + kPacksPerBlock - 1) / kPacksPerBlock;
      t.first_block[j + 1] = t.first_block[j] + (blocks > 0 ? blocks : (t.n[j] > 0 ? 1 : 0));
    }
    const int64_t blocks = t.first_block[t.count];
    if (blocks == 0) continue;
    QG_CHECK(blocks <= 0x7fffffff, ctx.op, blocks, " blocks exceed one launch");
    multi_cast_kernel<Src, Dst><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(t);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
}

void multi_tensor_cast_cuda(KernelContext& ctx) {
  check_multi_tensor_cast_inputs(ctx);
  QG_CHECK(ctx.inputs[0].dtype() == DType::f32, ctx.op, "no kernel for ", ctx.inputs[0].str(),
           " inputs (the pass casts f32 parameters)");
  switch (ctx.outputs[0].dtype()) {
    case DType::bf16:
      return launch<float, __nv_bfloat16>(ctx);
    case DType::f16:
      return launch<float, __half>(ctx);
    default:
      QG_FAIL(ctx.op, "no kernel for ", dtype_name(ctx.outputs[0].dtype()),
              " outputs (the pass casts to bf16 or f16)");
  }
}

}  // namespace

void add_fused_multi_tensor_cast_cuda_kernel(OpRegistry& r) {
  r.get_mutable("fused_multi_tensor_cast")
      .kernels.push_back({DeviceType::cuda, {}, multi_tensor_cast_cuda});
}

}  // namespace qg
