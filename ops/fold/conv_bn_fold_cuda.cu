// CUDA kernels of conv_bn_fold_weight and its backward (ops/fold/conv_bn_fold_ops.cpp): one
// launch each, one block per output channel. The tensors are a conv's weights ([64, 64, 3, 3]
// in the CNN) and [O] vectors, so what these kernels save is the launches of the generic
// chain they replace (4 forward, 6 backward inside a replayed CUDA graph), not bandwidth.
// Bits: every expression is the CPU kernel's, in T, with nvcc's IEEE sqrt and division (no
// fast math) and --fmad=false, so each rounding is the same. The one reduction, dgamma's
// sum over w's other axes, must add its f64 terms in the CPU's (sum_to's) row-major order to
// give the same bits, so the block forms the rounded products in parallel into shared memory
// and thread 0 adds them in order: a chain of C*k*k dependent f64 adds (576 in the CNN),
// a few microseconds, against the five launches of the chain's backward it replaces.
// Cost (sm_90 SASS, f32): forward 18 instructions per element of its row loop (after one
// sqrt and one division per thread); backward 22 per element of the parallel loop (two
// loads, two multiplies, the dw store and the shared-memory store), then thread 0's ordered
// sum at 17 per 4 elements (one LDS.128, four F2F.F64.F32 and four dependent DADDs).
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/fold/fold_args.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kBackwardThreads = 128;
constexpr int kChunk = kBackwardThreads * 8;  // products staged per pass of the ordered sum

// Block o: scale_factor[o], running_std[o] and row o of w_fold. Every thread derives the
// scale factor itself (the same bits in each; no shared memory or barrier needed).
template <typename T>
__global__ void fold_forward_kernel(const T* __restrict__ w, const T* __restrict__ gamma,
                                    const T* __restrict__ var, T eps, int64_t per,
                                    T* __restrict__ w_fold, T* __restrict__ scale_factor,
                                    T* __restrict__ running_std) {
  const int64_t o = blockIdx.x;
  const T shifted = var[o] + eps;
  const T sd = sqrt(shifted);
  const T sf = gamma[o] / sd;
  if (threadIdx.x == 0) {
    running_std[o] = sd;
    scale_factor[o] = sf;
  }
  const T* row = w + o * per;
  T* out = w_fold + o * per;
  for (int64_t i = threadIdx.x; i < per; i += blockDim.x) out[i] = row[i] * sf;
}

// Block o: row o of dw and dgamma[o]. The products d_w_fold * w (rounded to T, as the
// chain's mul stored them) go to shared memory a chunk at a time; thread 0 adds them in
// index order in f64 from +0.0, as sum_to's CPU kernel walks the row.
template <typename T>
__global__ void fold_backward_kernel(const T* __restrict__ d_w_fold,
                                     const T* __restrict__ d_scale_factor, const T* __restrict__ w,
                                     const T* __restrict__ scale_factor,
                                     const T* __restrict__ running_std, int64_t per,
                                     T* __restrict__ dw, T* __restrict__ dgamma) {
  __shared__ T products[kChunk];
  const int64_t o = blockIdx.x;
  const T sf = scale_factor[o];
  const T* d_row = d_w_fold + o * per;
  const T* w_row = w + o * per;
  T* dw_row = dw + o * per;
  double sum = 0;
  for (int64_t base = 0; base < per; base += kChunk) {
    const int64_t len = per - base < kChunk ? per - base : kChunk;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
      const T d = d_row[base + j];
      dw_row[base + j] = d * sf;
      products[j] = d * w_row[base + j];
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int64_t j = 0; j < len; ++j) sum += static_cast<double>(products[j]);
    __syncthreads();  // the next chunk overwrites the products
  }
  if (threadIdx.x == 0) {
    const T d_sf = d_scale_factor[o] + static_cast<T>(sum);
    dgamma[o] = d_sf / running_std[o];
  }
}

int64_t row_length(const Tensor& w) {
  return w.shape()[0] == 0 ? 0 : w.numel() / w.shape()[0];
}

template <typename T>
void forward_cuda(KernelContext& ctx) {
  const Tensor& w = ctx.inputs[0];
  const int64_t channels = w.shape()[0], per = row_length(w);
  if (channels == 0) return;
  QG_CHECK(channels < (int64_t{1} << 31), ctx.op, "at most 2^31 - 1 output channels, got ",
           w.str());
  // A warp at least, up to 256 threads: a 3x3 kernel's row of 64 input channels is 576.
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, per)));
  fold_forward_kernel<T><<<static_cast<unsigned>(channels), threads, 0, cuda_stream(ctx.device)>>>(
      in_ptr<T>(w), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]),
      static_cast<T>(ctx.args<FoldArgs>().eps), per, out_ptr<T>(ctx.outputs[0]),
      out_ptr<T>(ctx.outputs[1]), out_ptr<T>(ctx.outputs[2]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void backward_cuda(KernelContext& ctx) {
  const Tensor& d = ctx.inputs[0];
  const int64_t channels = d.shape()[0], per = row_length(d);
  if (channels == 0) return;
  QG_CHECK(channels < (int64_t{1} << 31), ctx.op, "at most 2^31 - 1 output channels, got ",
           d.str());
  fold_backward_kernel<T>
      <<<static_cast<unsigned>(channels), kBackwardThreads, 0, cuda_stream(ctx.device)>>>(
          in_ptr<T>(d), in_ptr<T>(ctx.inputs[1]), in_ptr<T>(ctx.inputs[2]),
          in_ptr<T>(ctx.inputs[3]), in_ptr<T>(ctx.inputs[4]), per, out_ptr<T>(ctx.outputs[0]),
          out_ptr<T>(ctx.outputs[1]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_fold_cuda_kernels(OpRegistry& r) {
  r.get_mutable("conv_bn_fold_weight")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, [](KernelContext& ctx) {
                            dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                                             [&](auto tag) { forward_cuda<decltype(tag)>(ctx); });
                          }});
  r.get_mutable("conv_bn_fold_weight_backward")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, [](KernelContext& ctx) {
                            dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                                             [&](auto tag) { backward_cuda<decltype(tag)>(ctx); });
                          }});
}

}  // namespace qg
