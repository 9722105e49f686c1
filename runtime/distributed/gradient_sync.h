// The data-parallel gradient all-reduce, as compile()'s gradient-sync stage
// (TrainingSpec::gradient_sync): the parameter gradients are packed into buckets of about
// `bucket_bytes` (25 MiB, DDP's default), each bucket is averaged over the ranks by one
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
#pragma once

#include <cstdint>

#include "runtime/compile.h"

namespace qg::dist {

inline constexpr int64_t kDefaultBucketBytes = int64_t{25} << 20;

// A GradientSync that averages the gradients over the ranks of the communicator bound to the
// compiled step's DeviceContext (CompileOptions::context.communicator).
GradientSync bucketed_all_reduce(int64_t bucket_bytes = kDefaultBucketBytes);

}  // namespace qg::dist
