// conv2d on the GPU: im2col into a workspace, then cuBLAS strided-batched GEMMs; dx goes
// through a gather-form col2im (one thread per input pixel, no atomics, deterministic).
// forward and dx batch over the images of a chunk or over the groups, whichever needs fewer
// calls; dw, which sums over the images, runs one call per image batched over the groups.
// Tensors are row-major and cuBLAS is column-major, so each product is computed transposed
// (the column-major view of a row-major [r, c] matrix is its [c, r] transpose):
//   forward  y_g [Og, P] = W_g [Og, K] col [K, P]   ->  y^T = col^T W_g^T
//   dx       col [K, P]  = W_g^T dy_g               ->  col^T = dy_g^T W_g
//   dw       dW_g [Og, K] += dy_g col^T             ->  dW_g^T += col dy_g^T
// (K = C/groups * kH * kW, P = Ho * Wo.) The math mode is cuBLAS's default: no TF32 for
// f32, so the GEMMs agree with the CPU's Eigen products to summation order (TF32 only when
// the DeviceContext's precision flags allow it).
// The im2col workspace holds at most kWorkspaceBytes: the batch is processed in chunks of
// images that fit (at least one image per chunk, however large). A 1x1 kernel with stride
// 1 and no padding needs no im2col: x itself is the column matrix.
// When cuDNN is built in (ops/conv/conv_cudnn.h), forward, dx and dw go through cuDNN
// instead; QG_CONV_BACKEND=im2col keeps this path (the README gives both timings).
#include <algorithm>

#include "core/graph.h"
#include "device/cuda/cublas_handle.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/dispatch_f32_f64.h"
#include "ops/conv/conv_cudnn.h"
#include "ops/conv/conv_geometry.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int64_t kWorkspaceBytes = int64_t{256} << 20;

// A GEMM of column-major operands, batched with strides; all sizes checked to fit int.
struct Gemm {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int64_t batch = 1;
};

template <typename T>
void run_gemm(const std::string& op, DeviceContext& context, const Gemm& g, const T* a, const T* b,
              T* c, T beta) {
  const int64_t limit = INT32_MAX;
  QG_CHECK(g.m <= limit && g.n <= limit && g.k <= limit && g.lda <= limit && g.ldb <= limit &&
               g.ldc <= limit && g.batch <= limit,
           op, "cuBLAS takes 32-bit sizes; GEMM m=", g.m, " n=", g.n, " k=", g.k,
           " batch=", g.batch, " is too large");
  cublasHandle_t h = cublas_handle(context);
  QG_CUBLAS_CHECK(op,
                  cuda::cublas_api().SetMathMode(
                      h, context.allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  const T one = 1;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb),
            ldc = static_cast<int>(g.ldc), batch = static_cast<int>(g.batch);
  if constexpr (std::is_same_v<T, double>) {
    QG_CUBLAS_CHECK(op, cuda::cublas_api().DgemmStridedBatched(h, g.ta, g.tb, m, n, k, &one, a, lda,
                                                               g.stride_a, b, ldb, g.stride_b,
                                                               &beta, c, ldc, g.stride_c, batch));
  } else {
    QG_CUBLAS_CHECK(op, cuda::cublas_api().SgemmStridedBatched(h, g.ta, g.tb, m, n, k, &one, a, lda,
                                                               g.stride_a, b, ldb, g.stride_b,
                                                               &beta, c, ldc, g.stride_c, batch));
  }
}

// An operand of gemm_images_groups: its base pointer and how far it moves per image and
// per group.
template <typename P>
struct Operand {
  P base;
  int64_t per_image, per_group;
};

// Runs `gm` for every (image < images, group < groups) pair with beta 0: one strided-batched
// call per group over the images, or one per image over the groups, whichever is fewer
// calls (groups == 1: a single call for the whole chunk, the weight's image stride is 0).
template <typename T>
void gemm_images_groups(const std::string& op, DeviceContext& context, Gemm gm, int64_t images,
                        int64_t groups, Operand<const T*> a, Operand<const T*> b, Operand<T*> c) {
  const bool over_images = images >= groups;
  gm.batch = over_images ? images : groups;
  gm.stride_a = over_images ? a.per_image : a.per_group;
  gm.stride_b = over_images ? b.per_image : b.per_group;
  gm.stride_c = over_images ? c.per_image : c.per_group;
  const int64_t calls = over_images ? groups : images;
  for (int64_t i = 0; i < calls; ++i) {
    const int64_t step_a = over_images ? a.per_group : a.per_image;
    const int64_t step_b = over_images ? b.per_group : b.per_image;
    const int64_t step_c = over_images ? c.per_group : c.per_image;
    run_gemm<T>(op, context, gm, a.base + i * step_a, b.base + i * step_b, c.base + i * step_c,
                T(0));
  }
}

// The kernel-side copy of ConvGeometry (plain values passed by value to the kernels).
struct Dims {
  int64_t c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo;
};

Dims dims_of(const ConvGeometry& g) {
  return {g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.ho, g.wo};
}

// col[n][(c * kH + i) * kW + j][oh * Wo + ow] for `images` images starting at x.
template <typename T>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ col, Dims d, int64_t total) {
  const int64_t p = d.ho * d.wo;
  for (int64_t idx = global_thread(); idx < total; idx += global_stride()) {
    const int64_t ow = idx % d.wo;
    const int64_t oh = (idx / d.wo) % d.ho;
    const int64_t row = idx / p;  // n * C * kH * kW + (c * kH + i) * kW + j
    const int64_t j = row % d.kw;
    const int64_t i = (row / d.kw) % d.kh;
    const int64_t nc = row / (d.kw * d.kh);  // n * C + c
    const int64_t ih = oh * d.sh - d.ph + i * d.dh;
    const int64_t iw = ow * d.sw - d.pw + j * d.dw;
    T v = T(0);
    if (ih >= 0 && ih < d.h && iw >= 0 && iw < d.w) v = x[(nc * d.h + ih) * d.w + iw];
    col[idx] = v;
  }
}

// dx[n][c][ih][iw] = sum of the column entries read from that pixel (the adjoint of
// im2col), gathered in a fixed (i, j) order.
template <typename T>
__global__ void col2im_kernel(const T* __restrict__ col, T* __restrict__ dx, Dims d,
                              int64_t total) {
  const int64_t p = d.ho * d.wo;
  for (int64_t idx = global_thread(); idx < total; idx += global_stride()) {
    const int64_t iw = idx % d.w;
    const int64_t ih = (idx / d.w) % d.h;
    const int64_t nc = idx / (d.w * d.h);  // n * C + c
    T acc = T(0);
    for (int64_t i = 0; i < d.kh; ++i) {
      const int64_t th = ih + d.ph - i * d.dh;
      if (th < 0 || th % d.sh != 0) continue;
      const int64_t oh = th / d.sh;
      if (oh >= d.ho) continue;
      for (int64_t j = 0; j < d.kw; ++j) {
        const int64_t tw = iw + d.pw - j * d.dw;
        if (tw < 0 || tw % d.sw != 0) continue;
        const int64_t ow = tw / d.sw;
        if (ow >= d.wo) continue;
        acc += col[((nc * d.kh + i) * d.kw + j) * p + oh * d.wo + ow];
      }
    }
    dx[idx] = acc;
  }
}

template <typename T>
__global__ void add_bias_kernel(T* __restrict__ y, const T* __restrict__ b, int64_t channels,
                                int64_t plane, int64_t total) {
  for (int64_t idx = global_thread(); idx < total; idx += global_stride())
    y[idx] += b[(idx / plane) % channels];
}

// One block per output channel: fixed thread assignment and a fixed tree, deterministic.
constexpr int kBiasThreads = 256;
template <typename T>
__global__ void bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ db, int64_t images,
                                 int64_t channels, int64_t plane) {
  __shared__ T partial[kBiasThreads];
  const int64_t o = blockIdx.x;
  T acc = T(0);
  for (int64_t t = threadIdx.x; t < images * plane; t += kBiasThreads)
    acc += dy[((t / plane) * channels + o) * plane + t % plane];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kBiasThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[o] = partial[0];
}

bool is_pointwise(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}

// Images per chunk so that the chunk's im2col matrices fit the workspace (at least one).
int64_t chunk_images(const ConvGeometry& g, size_t elem) {
  const int64_t per_image = std::max<int64_t>(1, g.c * g.kh * g.kw * g.ho * g.wo * elem);
  return std::max<int64_t>(1, std::min<int64_t>(g.n, kWorkspaceBytes / per_image));
}

template <typename T>
void launch_im2col(const std::string& op, cudaStream_t s, const ConvGeometry& g, const T* x, T* col,
                   int64_t images) {
  const int64_t total = images * g.c * g.kh * g.kw * g.ho * g.wo;
  if (total == 0) return;
  auto shape = elementwise_launch(total);
  im2col_kernel<T><<<shape.blocks, shape.threads, 0, s>>>(x, col, dims_of(g), total);
  QG_CUDA_CHECK_LAUNCH(op);
}

template <typename T>
void forward(KernelContext& ctx, const ConvGeometry& g) {
  const Tensor& x = ctx.inputs[0];
  auto s = cuda_stream(ctx.device);
  const int64_t og = g.o_per_group(), k = g.col_rows(), p = g.col_cols();
  const int64_t image_cols = g.groups * k * p, image_x = g.c * g.h * g.w, image_y = g.o * p;
  const bool pointwise = is_pointwise(g);
  const int64_t chunk = pointwise ? g.n : chunk_images(g, sizeof(T));
  Tensor workspace =
      pointwise ? Tensor() : Tensor::empty({chunk * image_cols}, x.dtype(), x.device());
  const T* w = in_ptr<T>(ctx.inputs[1]);
  T* y = out_ptr<T>(ctx.outputs[0]);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.n - n0);
    const T* col = in_ptr<T>(x) + n0 * image_x;
    if (!pointwise) {
      launch_im2col<T>(ctx.op, s, g, col, out_ptr<T>(workspace), nb);
      col = in_ptr<T>(workspace);
    }
    Gemm gm{CUBLAS_OP_N, CUBLAS_OP_N, p, og, k, p, k, p};
    gemm_images_groups<T>(ctx.op, ctx.device, gm, nb, g.groups, {col, image_cols, k * p},
                          {w, 0, og * k}, {y + n0 * image_y, image_y, og * p});
  }
  const int64_t total = ctx.outputs[0].numel();
  auto shape = elementwise_launch(total);
  add_bias_kernel<T>
      <<<shape.blocks, shape.threads, 0, s>>>(y, in_ptr<T>(ctx.inputs[2]), g.o, p, total);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

template <typename T>
void backward_input(KernelContext& ctx, const ConvGeometry& g) {
  const Tensor& dy = ctx.inputs[0];
  auto s = cuda_stream(ctx.device);
  const int64_t og = g.o_per_group(), k = g.col_rows(), p = g.col_cols();
  const int64_t image_cols = g.groups * k * p, image_x = g.c * g.h * g.w, image_y = g.o * p;
  const bool pointwise = is_pointwise(g);
  const int64_t chunk = pointwise ? g.n : chunk_images(g, sizeof(T));
  Tensor workspace =
      pointwise ? Tensor() : Tensor::empty({chunk * image_cols}, dy.dtype(), dy.device());
  const T* w = in_ptr<T>(ctx.inputs[1]);
  T* dx = out_ptr<T>(ctx.outputs[0]);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.n - n0);
    T* col = pointwise ? dx + n0 * image_x : out_ptr<T>(workspace);
    const T* dyc = in_ptr<T>(dy) + n0 * image_y;
    Gemm gm{CUBLAS_OP_N, CUBLAS_OP_T, p, k, og, p, k, p};
    gemm_images_groups<T>(ctx.op, ctx.device, gm, nb, g.groups, {dyc, image_y, og * p},
                          {w, 0, og * k}, {col, image_cols, k * p});
    if (pointwise) continue;
    const int64_t total = nb * image_x;
    auto shape = elementwise_launch(total);
    col2im_kernel<T>
        <<<shape.blocks, shape.threads, 0, s>>>(col, dx + n0 * image_x, dims_of(g), total);
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
}

template <typename T>
void backward_weight(KernelContext& ctx, const ConvGeometry& g) {
  const Tensor& x = ctx.inputs[1];
  auto s = cuda_stream(ctx.device);
  const int64_t og = g.o_per_group(), k = g.col_rows(), p = g.col_cols();
  const int64_t image_cols = g.groups * k * p, image_x = g.c * g.h * g.w, image_y = g.o * p;
  T* dw = out_ptr<T>(ctx.outputs[0]);
  if (g.n == 0) {
    QG_CUDA_CHECK(ctx.op, cudaMemsetAsync(dw, 0, ctx.outputs[0].nbytes(), s));
    return;
  }
  const bool pointwise = is_pointwise(g);
  const int64_t chunk = pointwise ? g.n : chunk_images(g, sizeof(T));
  Tensor workspace =
      pointwise ? Tensor() : Tensor::empty({chunk * image_cols}, x.dtype(), x.device());
  // Per image, batched over the groups; the first image writes dW, the others add to it.
  Gemm gm{CUBLAS_OP_T, CUBLAS_OP_N, k, og, p, p, p, k};
  gm.stride_a = k * p, gm.stride_b = og * p, gm.stride_c = og * k, gm.batch = g.groups;
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.n - n0);
    const T* col = in_ptr<T>(x) + n0 * image_x;
    if (!pointwise) {
      launch_im2col<T>(ctx.op, s, g, col, out_ptr<T>(workspace), nb);
      col = in_ptr<T>(workspace);
    }
    for (int64_t i = 0; i < nb; ++i)
      run_gemm<T>(ctx.op, ctx.device, gm, col + i * image_cols,
                  in_ptr<T>(ctx.inputs[0]) + (n0 + i) * image_y, dw, n0 + i == 0 ? T(0) : T(1));
  }
}

template <typename T>
void backward_bias(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const int64_t channels = dy.size(1);
  if (channels == 0) return;
  auto s = cuda_stream(ctx.device);
  QG_CHECK(channels <= INT32_MAX, ctx.op, "too many channels for one block each: ", dy.str());
  bias_grad_kernel<T><<<static_cast<unsigned>(channels), kBiasThreads, 0, s>>>(
      in_ptr<T>(dy), out_ptr<T>(ctx.outputs[0]), dy.size(0), channels, dy.size(2) * dy.size(3));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

void conv2d_forward_cuda(KernelContext& ctx) {
  const ConvGeometry& g = ctx.args<ConvArgs>().geometry;
  if (ctx.outputs[0].numel() == 0) return;
  if (cudnn_conv::enabled() && g.n > 0) {
    cudnn_conv::forward(ctx.op.c_str(), g, ctx.inputs[0], ctx.inputs[1], &ctx.inputs[2],
                        ctx.outputs[0], ctx.device);
    return;
  }
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { forward<decltype(tag)>(ctx, g); });
}

void conv2d_backward_input_cuda(KernelContext& ctx) {
  const ConvGeometry& g = ctx.args<ConvArgs>().geometry;
  if (ctx.outputs[0].numel() == 0) return;
  if (cudnn_conv::enabled()) {
    cudnn_conv::backward_data(ctx.op.c_str(), g, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                              ctx.device);
    return;
  }
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { backward_input<decltype(tag)>(ctx, g); });
}

void conv2d_backward_weight_cuda(KernelContext& ctx) {
  const ConvGeometry& g = ctx.args<ConvArgs>().geometry;
  if (ctx.outputs[0].numel() == 0) return;
  // An empty batch gives dw = 0, which the im2col path writes (cuDNN rejects N = 0).
  if (cudnn_conv::enabled() && g.n > 0) {
    cudnn_conv::backward_filter(ctx.op.c_str(), g, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                                ctx.device);
    return;
  }
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { backward_weight<decltype(tag)>(ctx, g); });
}

void conv2d_backward_bias_cuda(KernelContext& ctx) {
  dispatch_f32_f64(ctx.inputs[0].dtype(), ctx.op,
                   [&](auto tag) { backward_bias<decltype(tag)>(ctx); });
}

}  // namespace

void add_conv_cuda_kernels(OpRegistry& r) {
  r.get_mutable("conv2d").kernels.push_back({DeviceType::cuda, kF32F64DTypes, conv2d_forward_cuda});
  r.get_mutable("conv2d_backward_input")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, conv2d_backward_input_cuda});
  r.get_mutable("conv2d_backward_weight")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, conv2d_backward_weight_cuda});
  r.get_mutable("conv2d_backward_bias")
      .kernels.push_back({DeviceType::cuda, kF32F64DTypes, conv2d_backward_bias_cuda});
}

}  // namespace qg
