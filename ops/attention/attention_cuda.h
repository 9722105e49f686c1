// The CUDA kernels of the causal attention ops (attention_forward.cu, attention_backward.cu)
// and what they share on the host: the head dims they take and the layout they pass.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/op_schema.h"
#include "ops/attention/attention_args.h"
#include "ops/attention/attention_strides.h"

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

// The tensor-core kernels move rows of q, k, v (o, do) 16 bytes at a time, so every row must
// start on a 16-byte boundary: the view's first element, and each of its batch, head and seq
// strides a whole number of 16 bytes. Graph buffers start on 512-byte boundaries with
// contiguous rows of 64 or 128 elements; a tensor handed to the kernel directly (a view at an
// odd offset, a slice with an odd row stride) may not. lse is read element by element.
inline void check_vector_aligned(const KernelContext& ctx, const AttentionStrides& s) {
  static const char* const names[] = {"q", "k", "v", "o", "lse", "do"};
  const RowStrides* rows[] = {&s.q, &s.k, &s.v, &s.o, nullptr, &s.dout};
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (rows[i] == nullptr) continue;
    const Tensor& t = ctx.inputs[i];
    QG_CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0, ctx.op, "input ", i, " ('",
             names[i], "') must start on a 16-byte boundary for the tensor-core kernel, got ",
             t.raw_data());
    const int64_t es = static_cast<int64_t>(dtype_size(t.dtype()));
    const RowStrides& r = *rows[i];
    QG_CHECK((r.batch * es) % 16 == 0 && (r.head * es) % 16 == 0 && (r.seq * es) % 16 == 0, ctx.op,
             "input ", i, " ('", names[i], "') has strides ", shape_str(t.strides()), " for shape ",
             shape_str(t.shape()), " (elements of ", es,
             " bytes); the tensor-core kernel needs its rows on 16-byte boundaries: the "
             "batch, head and seq strides a multiple of ",
             16 / es, " elements");
  }
  for (size_t i = 0; i < ctx.outputs.size(); ++i)
    QG_CHECK(reinterpret_cast<uintptr_t>(ctx.outputs[i].raw_data()) % 16 == 0, ctx.op, "output ", i,
             " must start on a 16-byte boundary for the tensor-core kernel, got ",
             ctx.outputs[i].raw_data());
}

void causal_attention_cuda(KernelContext& ctx);
void causal_attention_backward_cuda(KernelContext& ctx);

}  // namespace qg
