// The data-parallel gradient all-reduce, as compile()'s gradient-sync stage
// (TrainingSpec::gradient_sync): the parameter gradients are packed into buckets of about
// `bucket_bytes` (400 MiB by default; see kDefaultBucketBytes), each bucket is averaged over
// the ranks by one
// all_reduce node, and the optimizer reads the averaged gradients out of it
// (ops/collective/collective_ops.cpp draws the chain).
//
// Buckets are filled in reverse parameter order, the order in which the backward pass
// produces the gradients (the last layer's first), so a bucket is complete, and its
// all-reduce can start, while the backward pass is still working on earlier layers.
//
// Numerics: avg is the f32 sum over the ranks divided by the rank count. With each rank's
// loss the mean over its shard of B / N rows, the averaged gradient is the gradient of the
// mean loss over the B rows of the global batch, as one process computes it, up to the order
// of the additions (N = 2: a + b, exact pairwise; N > 2: the ring's order). See
// docs/DISTRIBUTED.md for the tolerances the tests use.
//
// `reduce_dtype` bf16 (or f16) sends the gradients in half the bytes, as FSDP's
// MixedPrecision(reduce_dtype) and DDP's bf16 compression hook do: each gradient is cast to
// it when its bucket is packed, the bucket is all-reduced in that dtype (every partial sum
// rounded to it: NCCL sums bf16 in f32 and rounds each result; the Gloo backend does the
// same), and each averaged gradient is cast back to its own dtype when the optimizer reads
// it. The ranks still hold the same averaged gradient bit for bit; it differs from the f32
// average by the bf16 roundings (relative 2^-8 per element and addition).
#pragma once

#include <cstdint>

#include "runtime/compile.h"

namespace qg::dist {

// The default cap: 400 MiB, not DDP's 25 MiB. Every all-reduce that runs beside the backward
// pass slows the kernels it shares the GPU with (NCCL's blocks hold SMs and memory bandwidth),
// and a few large all-reduces finish sooner, in total, than many small ones. Measured on 2x
// H100 (NVLink), the 207M Llama step (bf16-mixed, 828 MB of f32 gradients): the 2-GPU step
// scaled 1.83x at 25 MiB (26 buckets), 1.87x at 150-300 MiB, 1.905x at 400 MiB (2 buckets),
// 1.89x at 600 MiB and 1.85x with one bucket (issued at the end of the backward pass).
// docs/DISTRIBUTED.md has the table. A model whose gradients fit one bucket gets one.
inline constexpr int64_t kDefaultBucketBytes = int64_t{400} << 20;

// A GradientSync that averages the gradients over the ranks of the communicator bound to the
// compiled step's DeviceContext (CompileOptions::context.communicator).
// Throws qg::Error (op "gradient_sync") for a cap <= 0 or a reduce dtype other than f32, f64,
// bf16 or f16; a gradient that is not floating point is reduced in its own dtype.
GradientSync bucketed_all_reduce(int64_t bucket_bytes = kDefaultBucketBytes,
                                 DType reduce_dtype = DType::f32);

}  // namespace qg::dist
