// CUDA kernels of int8_matmul and int8_matmul_ste: the tensor-core GEMM of
// int8_gemm_cuda.cu on the context's stream, after the same shape checks the
// CPU kernel's parser made. Unlike the CPU kernel, the GPU does not re-check
// the scales and zero points at run time (that would need a pass over them and
// a report through the device error buffer): in the graphs that build these ops
// they come from dynamic_fake_quantize, which has already refused a non-finite
// scale, and from constants that shape inference checked.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/int8_matmul/int8_gemm_cuda.cuh"
#include "ops/int8_matmul/int8_matmul_args.h"

namespace qg {
namespace {

// f64 outputs (the gradient check's dtype): one thread per output, the contract's steps in
// order. Tiny graphs only, so no tensor cores; the integer arithmetic is the same f32 as the
// fast kernel's, widened exactly at the end.
__global__ void int8_matmul_f64_kernel(int8_gemm::Problem p, double* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.m * p.n) return;
  const int64_t m = i / p.n, n = i % p.n, groups = p.k / p.group;
  const int8_t* a = p.a + m * p.k;
  const int8_t* w = p.w + n * p.k;
  float acc = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    int32_t dot = 0;
    for (int64_t k = g * p.group; k < (g + 1) * p.group; ++k)
      dot += (int32_t{a[k]} - p.a_zero[m]) * int32_t{w[k]};
    acc = __fmaf_rn(__int2float_rn(dot), p.w_scale[n * groups + g], acc);
  }
  y[i] = static_cast<double>(__fmul_rn(acc, p.a_scale[m]));
}

int8_gemm::OutType out_type(const std::string& op, DType d) {
  switch (d) {
    case DType::f32:
      return int8_gemm::OutType::f32;
    case DType::bf16:
      return int8_gemm::OutType::bf16;
    case DType::f16:
      return int8_gemm::OutType::f16;
    default:
      QG_FAIL(op, "the CUDA kernel writes f32, bf16 or f16, not ", dtype_name(d));
  }
}

void int8_matmul_cuda(KernelContext& ctx) {
  const Int8MatmulArgs& a = ctx.args<Int8MatmulArgs>();
  const int c = a.codes;
  QG_CHECK(a.group % 32 == 0, ctx.op,
           "the CUDA kernel needs a weight group that is a multiple "
           "of 32 codes (one tensor-core k-step), got ",
           a.group);
  int8_gemm::Problem p;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.group = a.group;
  p.a = ctx.inputs[c].data<int8_t>();
  p.a_scale = ctx.inputs[c + 1].data<float>();
  p.a_zero = ctx.inputs[c + 2].data<int32_t>();
  p.w = ctx.inputs[c + 3].data<int8_t>();
  p.w_scale = ctx.inputs[c + 4].data<float>();
  p.y = ctx.outputs[0].raw_data();
  if (a.out == DType::f64) {
    const int64_t n = a.m * a.n;
    int8_matmul_f64_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0,
                             cuda_stream(ctx.device)>>>(p, ctx.outputs[0].data<double>());
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    return;
  }
  p.out = out_type(ctx.op, a.out);
  int8_gemm::launch(p, cuda_stream(ctx.device), ctx.op.c_str());
}

}  // namespace

void add_int8_matmul_cuda_kernels(OpRegistry& r) {
  r.get_mutable("int8_matmul")
      .kernels.push_back(
          {DeviceType::cuda, KernelDTypes::for_inputs({{DType::i8}}), int8_matmul_cuda});
  r.get_mutable("int8_matmul_ste")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, int8_matmul_cuda});
}

}  // namespace qg
