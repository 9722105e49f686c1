// matmul on the GPU through cuBLAS. Tensors are row-major and cuBLAS is column-major, so
// the product is computed transposed: C^T = op(B)^T op(A)^T, where the column-major view
// of a row-major matrix already is its transpose. f32 uses the pedantic f32 compute type
// (no TF32, which would miss the 1e-5 agreement with the CPU) unless TF32 is allowed
// (the DeviceContext's precision flags); f16/bf16 accumulate in f32 and round once, as the CPU
// kernel does.
#include "core/graph.h"
#include "device/cuda/cublas_handle.h"
#include "ops/common/cuda_common.cuh"
#include "ops/linalg/matmul_args.h"

namespace qg {
namespace {

using namespace cuda;

// The context's handle with the math mode its TF32 switch asks for (pedantic otherwise, so
// no reduced-precision shortcut reaches f32).
cublasHandle_t handle_on(const std::string& op, DeviceContext& context) {
  cublasHandle_t h = cublas_handle(context);
  QG_CUBLAS_CHECK(op,
                  cuda::cublas_api().SetMathMode(
                      h, context.allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
  return h;
}

template <typename T>
__global__ void zero_kernel(T* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_stride()) y[i] = from_math<T>(0);
}

void matmul_cuda(KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  const Tensor& b = ctx.inputs[1];
  Tensor& y = ctx.outputs[0];
  const MatmulArgs& args = ctx.args<MatmulArgs>();
  const bool ta = args.transpose_a, tb = args.transpose_b;
  int64_t m = y.size(0), n = y.size(1), k = ta ? a.size(0) : a.size(1);
  if (y.numel() == 0) return;
  auto s = cuda_stream(ctx.device);
  if (k == 0) {
    dispatch_float(y.dtype(), ctx.op, [&](auto tag) {
      using T = decltype(tag);
      auto shape = elementwise_launch(y.numel());
      zero_kernel<T><<<shape.blocks, shape.threads, 0, s>>>(out_ptr<T>(y), y.numel());
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
    return;
  }
  const int64_t limit = INT32_MAX;
  QG_CHECK(m <= limit && n <= limit && k <= limit && a.size(1) <= limit && b.size(1) <= limit,
           ctx.op, "cuBLAS takes 32-bit dimensions; got a ", a.str(), ", b ", b.str());
  cublasHandle_t h = handle_on(ctx.op, ctx.device);
  cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  int in = static_cast<int>(n), im = static_cast<int>(m), ik = static_cast<int>(k);
  int ldb = static_cast<int>(b.size(1)), lda = static_cast<int>(a.size(1)), ldc = in;
  switch (y.dtype()) {
    case DType::f64: {
      const double one = 1.0, zero = 0.0;
      QG_CUBLAS_CHECK(
          ctx.op, cuda::cublas_api().Dgemm(h, op_b, op_a, in, im, ik, &one, in_ptr<double>(b), ldb,
                                           in_ptr<double>(a), lda, &zero, out_ptr<double>(y), ldc));
      break;
    }
    case DType::f32:
    case DType::f16:
    case DType::bf16: {
      cudaDataType_t t = y.dtype() == DType::f32   ? CUDA_R_32F
                         : y.dtype() == DType::f16 ? CUDA_R_16F
                                                   : CUDA_R_16BF;
      cublasComputeType_t compute = y.dtype() != DType::f32   ? CUBLAS_COMPUTE_32F
                                    : ctx.device.allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                              : CUBLAS_COMPUTE_32F_PEDANTIC;
      const float one = 1.0f, zero = 0.0f;
      QG_CUBLAS_CHECK(
          ctx.op, cuda::cublas_api().GemmEx(h, op_b, op_a, in, im, ik, &one, b.raw_data(), t, ldb,
                                            a.raw_data(), t, lda, &zero, y.raw_data(), t, ldc,
                                            compute, CUBLAS_GEMM_DEFAULT));
      break;
    }
    default:
      QG_FAIL(ctx.op, "the CUDA backend has no matmul for dtype ", dtype_name(y.dtype()));
  }
}

// batched_matmul: the same transposed column-major call per batch, as one strided-batched
// GEMM (batch strides are the slice sizes of the contiguous tensors; the handle's math
// mode keeps TF32 out of f32 unless it is allowed).
void batched_matmul_cuda(KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  const Tensor& b = ctx.inputs[1];
  Tensor& y = ctx.outputs[0];
  const int r = y.dim();
  const MatmulArgs& args = ctx.args<MatmulArgs>();
  const bool ta = args.transpose_a, tb = args.transpose_b;
  int64_t m = y.size(r - 2), n = y.size(r - 1), k = ta ? a.size(r - 2) : a.size(r - 1);
  if (y.numel() == 0) return;
  auto s = cuda_stream(ctx.device);
  if (k == 0) {
    dispatch_float(y.dtype(), ctx.op, [&](auto tag) {
      using T = decltype(tag);
      auto shape = elementwise_launch(y.numel());
      zero_kernel<T><<<shape.blocks, shape.threads, 0, s>>>(out_ptr<T>(y), y.numel());
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
    return;
  }
  const int64_t batches = y.numel() / (m * n);
  const int64_t limit = INT32_MAX;
  QG_CHECK(m <= limit && n <= limit && k <= limit && batches <= limit && a.size(r - 1) <= limit &&
               b.size(r - 1) <= limit,
           ctx.op, "cuBLAS takes 32-bit dimensions and batch counts; got a ", a.str(), ", b ",
           b.str());
  cublasHandle_t h = handle_on(ctx.op, ctx.device);
  cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  int in = static_cast<int>(n), im = static_cast<int>(m), ik = static_cast<int>(k);
  int ldb = static_cast<int>(b.size(r - 1)), lda = static_cast<int>(a.size(r - 1)), ldc = in;
  long long sa = a.size(r - 2) * a.size(r - 1), sb = b.size(r - 2) * b.size(r - 1), sy = m * n;
  int count = static_cast<int>(batches);
  switch (y.dtype()) {
    case DType::f64: {
      const double one = 1.0, zero = 0.0;
      QG_CUBLAS_CHECK(ctx.op,
                      cuda::cublas_api().DgemmStridedBatched(
                          h, op_b, op_a, in, im, ik, &one, in_ptr<double>(b), ldb, sb,
                          in_ptr<double>(a), lda, sa, &zero, out_ptr<double>(y), ldc, sy, count));
      break;
    }
    case DType::f32: {
      const float one = 1.0f, zero = 0.0f;
      QG_CUBLAS_CHECK(
          ctx.op, cuda::cublas_api().SgemmStridedBatched(
                      h, op_b, op_a, in, im, ik, &one, in_ptr<float>(b), ldb, sb, in_ptr<float>(a),
                      lda, sa, &zero, out_ptr<float>(y), ldc, sy, count));
      break;
    }
    case DType::f16:
    case DType::bf16: {
      cudaDataType_t t = y.dtype() == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
      const float one = 1.0f, zero = 0.0f;
      QG_CUBLAS_CHECK(ctx.op, cuda::cublas_api().GemmStridedBatchedEx(
                                  h, op_b, op_a, in, im, ik, &one, b.raw_data(), t, ldb, sb,
                                  a.raw_data(), t, lda, sa, &zero, y.raw_data(), t, ldc, sy, count,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      break;
    }
    default:
      QG_FAIL(ctx.op, "the CUDA backend has no batched_matmul for dtype ", dtype_name(y.dtype()));
  }
}

}  // namespace

void add_linalg_cuda_kernels(OpRegistry& r) {
  r.get_mutable("matmul").kernels.push_back({DeviceType::cuda, kFloatDTypes, matmul_cuda});
  r.get_mutable("batched_matmul")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, batched_matmul_cuda});
}

}  // namespace qg
