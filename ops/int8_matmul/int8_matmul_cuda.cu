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
  p.out = out_type(ctx.op, a.out);
  int8_gemm::launch(p, cuda_stream(ctx.device), ctx.op.c_str());
}

}  // namespace

void add_int8_matmul_cuda_kernels(OpRegistry& r) {
  r.get_mutable("int8_matmul")
      .kernels.push_back(
          {DeviceType::cuda, KernelDTypes::for_inputs({{DType::i8}}), int8_matmul_cuda});
  OpDef& ste = r.get_mutable("int8_matmul_ste");
  ste.kernels.push_back(
      {DeviceType::cuda, {DType::f32, DType::bf16, DType::f16}, int8_matmul_cuda});
  // f64 is the gradient check's dtype; the integer arithmetic is f32 whatever
  // y's dtype.
  ste.cpu_only_dtypes = {DType::f64};
}

}  // namespace qg
