// The CUDA kernels of the causal attention ops (attention_forward.cu, attention_backward.cu)
// and what they share on the host: the head dims they take and the layout they pass.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/op_schema.h"
#include "ops/attention/attention_args.h"

namespace qg {

// Any even head dim up to kMaxAnyHeadDim: 64 and 128 (Llama's) take the tiled kernels,
// the others attention_any_head_dim.cu's (slower); a batch * heads that fits the tiled
// kernels' grid's second axis.
constexpr int64_t kMaxAnyHeadDim = 256;

inline bool tiled_head_dim(int64_t hd) {
  return hd == 64 || hd == 128;
}

inline void check_cuda_layout(const std::string& op, const AttentionLayout& a) {
  QG_CHECK(a.head_dim <= kMaxAnyHeadDim && a.head_dim % 2 == 0, op, "head_dim = ", a.head_dim,
           " is not supported on CUDA (the kernels take an even head_dim up to ", kMaxAnyHeadDim,
           ")");
  QG_CHECK(a.batch * a.heads <= 65535 && a.batch * a.kv_heads <= 65535, op,
           "batch * heads = ", a.batch * a.heads, " is over the CUDA grid's 65535");
}

// The tensor-core kernels move 16 bytes at a time; graph buffers start on 512-byte
// boundaries, but a tensor handed to the kernel directly (a view at an odd offset) may not.
inline void check_vector_aligned(const KernelContext& ctx) {
  auto check = [&](const Tensor& t, const char* what, size_t i) {
    QG_CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0, ctx.op, what, " ", i,
             " must start on a 16-byte boundary for the tensor-core kernel, got ", t.raw_data());
  };
  for (size_t i = 0; i < ctx.inputs.size(); ++i) check(ctx.inputs[i], "input", i);
  for (size_t i = 0; i < ctx.outputs.size(); ++i) check(ctx.outputs[i], "output", i);
}

void causal_attention_cuda(KernelContext& ctx);
void causal_attention_backward_cuda(KernelContext& ctx);

}  // namespace qg
