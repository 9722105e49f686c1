// causal_attention and its backward through cuDNN's fused SDPA (flash attention), built
// through the header-only cuDNN frontend when CMake finds cuDNN and the frontend
// (QG_WITH_CUDNN_FRONTEND). The CUDA kernels of attention_forward.cu and attention_backward.cu
// call forward() / backward() first and run their own kernels when these return false, as
// QG_ATTENTION_BACKEND selects (attention_backend.h).
//
// What cuDNN takes here: bf16 and f16 (f32 and f64 stay on the project's kernels), head dims 64
// and 128, q, k, v, o, do rows on 16-byte boundaries (every view's start and its batch, head
// and seq strides, none of them 0), lse with a seq stride of 1; GQA by k and v having fewer heads
// than q. The graphs are built once per (device, direction, dtype, shape, scale, strides,
// determinism) and cached for the process; a graph cuDNN refuses to build (an older cuDNN, a GPU it
// has no engine for) is remembered too, so `auto` falls back without asking again.
//
// Numerics (docs/LLM_NUMERICS.md): scores, softmax statistics and sums in f32, P and dS rounded
// to the input dtype as tensor-core operands, as the project's kernels do, but in cuDNN's order
// and with its exp, so the result agrees with the CPU reference and the project's kernels to the
// crosscheck's rounding rule (two storage ulps of each tensor's largest element), not bit for
// bit. lse is cuDNN's Stats (natural-log log-sum-exp of the scaled scores, f32, [N, H, T]),
// the same quantity the project's kernels save, so either backward runs from either forward.
// Row 0 sees one key, so its softmax is constant and ds_00 = 0: cuDNN computes that term as
// rounding noise, so the backward sets dq's row 0 to zero (and, at T = 1, all of dk), as the
// op's definition says; for T > 1, ds_00's noise stays one term among T in dk_0.
#pragma once

#include <string>
#include <vector>

#include "core/op_schema.h"
#include "ops/attention/attention_args.h"

namespace qg::cudnn_attention {

// Whether this build has the cuDNN path (CMake found cuDNN and its frontend).
bool built();

// Why the cuDNN path cannot take a call on these tensors ("" when it can), whether or not
// this build has it: the dtype, the head dim, a row off a 16-byte boundary, a strided lse, a
// backward at T = 1.
// `inputs` and `outputs` are the op's, forward {q, k, v} -> {o, lse} or backward
// {q, k, v, o, lse, do} -> {dq, dk, dv}.
std::string unsupported(const AttentionLayout& a, const std::vector<Tensor>& inputs,
                        const std::vector<Tensor>& outputs);

// The backward's o must be the forward's output for the same q, k, v (as the graph always
// passes it): cuDNN's dk is wrong for any other o, where the project's kernels and the CPU
// read o only through rowsum(do * o).
// Runs the op through cuDNN and returns true, or returns false for the caller to run its own
// kernels: QG_ATTENTION_BACKEND=kernel; or `auto` with a call cuDNN cannot take (unsupported(),
// a build without cuDNN, a graph cuDNN refuses). Under QG_ATTENTION_BACKEND=cudnn those are a
// qg::Error naming the op and the reason; so is every failing cuDNN or CUDA call.
bool forward(KernelContext& ctx, const AttentionLayout& a);
bool backward(KernelContext& ctx, const AttentionLayout& a);

}  // namespace qg::cudnn_attention
