// The fused op family: one subfolder per fused op, each holding the op (schema and CPU
// kernel), its CUDA kernels and the fusion rule that makes it out of ordinary nodes. The
// family's row in ops/op_table.cpp calls this.
#include "core/op_registry.h"
#include "ops/fused/cast_add/cast_add.h"
#include "ops/fused/cast_ste/cast_ste.h"
#include "ops/fused/channel_div_bn/channel_div_bn.h"
#include "ops/fused/multi_tensor_adam/multi_tensor_adam.h"
#include "ops/fused/multi_tensor_adamw/multi_tensor_adamw.h"
#include "ops/fused/multi_tensor_cast/multi_tensor_cast.h"
#include "ops/fused/norm_backward_add/norm_backward_add.h"
#include "ops/fused/observe_quantize/observe_quantize.h"
#include "ops/fused/scaled_softmax/scaled_softmax.h"
#include "ops/fused/ste_backward/ste_backward.h"
#include "ops/fused/ste_chain/ste_chain.h"
#include "ops/fused/ste_mul_pair/ste_mul_pair.h"
#include "ops/fused/ste_optimizer/ste_optimizer.h"
#include "ops/fused/ste_producer/ste_producer.h"
#include "ops/fused/swiglu/swiglu.h"

namespace qg {

void add_fused_crosscheck(OpRegistry& r);  // fused_crosscheck.cpp
#ifdef QG_WITH_CUDA
void add_fused_cuda_kernels(OpRegistry& r);                 // observe_quantize/cuda_dispatch.cu
void add_fused_ste_backward_cuda_kernels(OpRegistry& r);    // ste_backward/ste_backward_cuda.cu
void add_fused_ste_optimizer_cuda_kernels(OpRegistry& r);   // ste_optimizer/ste_optimizer_cuda.cu
void add_fused_ste_chain_cuda_kernels(OpRegistry& r);       // ste_chain/ste_chain_cuda.cu
void add_fused_ste_producer_cuda_kernels(OpRegistry& r);    // ste_producer/ste_producer_cuda.cu
void add_fused_ste_mul_pair_cuda_kernels(OpRegistry& r);    // ste_mul_pair/ste_mul_pair_cuda.cu
void add_channel_div_bn_cuda_kernels(OpRegistry& r);        // ops/norm/channel_div_bn_cuda.cu
void add_fused_scaled_softmax_cuda_kernels(OpRegistry& r);  // ops/softmax/softmax_cuda.cu
void add_fused_norm_backward_add_cuda_kernels(OpRegistry& r);  // ops/rms_norm/rms_norm_cuda.cu
void add_fused_cast_add_cuda_kernels(OpRegistry& r);           // cast_add/cast_add_cuda.cu
void add_fused_cast_ste_cuda_kernels(OpRegistry& r);           // cast_ste/cast_ste_cuda.cu
#endif

void define_fused_ops(OpRegistry& r) {
  define_fused_observe_quantize_op(r);
  define_fused_ste_backward_op(r);
  define_fused_channel_div_bn_ops(r);
  define_fused_ste_optimizer_op(r);
  define_fused_ste_chain_op(r);
  define_fused_ste_producer_op(r);
  define_fused_ste_mul_pair_op(r);
  define_fused_scaled_softmax_ops(r);
  define_fused_multi_tensor_adamw_op(r);
  define_fused_multi_tensor_adam_op(r);
  define_fused_cast_add_op(r);
  define_fused_cast_ste_op(r);
  define_fused_multi_tensor_cast_op(r);
  define_fused_swiglu_ops(r);
  define_fused_norm_backward_add_ops(r);
#ifdef QG_WITH_CUDA
  add_fused_cuda_kernels(r);
  add_fused_ste_backward_cuda_kernels(r);
  add_fused_ste_optimizer_cuda_kernels(r);
  add_fused_ste_chain_cuda_kernels(r);
  add_fused_ste_producer_cuda_kernels(r);
  add_fused_ste_mul_pair_cuda_kernels(r);
  add_channel_div_bn_cuda_kernels(r);
  add_fused_scaled_softmax_cuda_kernels(r);
  add_fused_cast_add_cuda_kernels(r);
  add_fused_norm_backward_add_cuda_kernels(r);
  add_fused_cast_ste_cuda_kernels(r);
#endif
  add_fused_crosscheck(r);
}

}  // namespace qg
