// Pieces every observer op shares: the attribute set (range, qscheme, scope), shape
// inference (scale f32 and zero_point i32 shaped by the scope), the common state entries
// (nonfinite_count, observer_enabled), the update gate (training mode AND the flag) and a
// loop visiting every finite element with its channel, counting the others.
#pragma once

#include <string>
#include <vector>

#include "core/graph.h"
#include "core/half.h"
#include "device/communicator.h"
#include "device/device_context.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/common/schema_helpers.h"

namespace qg {

// bits/signed/narrow_range/quant_min/quant_max/reduce_range, qscheme, symmetric_denominator,
// eps, scope (one of `scopes`), axis and group_size, plus the op's own attributes.
std::vector<AttrSpec> observer_attrs(const std::vector<AttrSpec>& extra = {},
                                     const std::vector<std::string>& scopes = {"tensor",
                                                                               "channel"});

// Every scope: the min/max observers keep one running range per token or per group too
// (per-group weight observers; per-token statistics of fixed-shape activations).
inline const std::vector<std::string> kAllObserverScopes = {"tensor", "channel", "token", "group"};

// `delayed` (min/max observers): the outputs are the qparams of the state as it was before
// this batch (the previous step's), while the batch still updates the state, as delayed
// scaling in FP8 training recipes does. A fused observer + quantizer then quantizes with
// qparams known before it reads x: one pass over x, whatever its size.
AttrSpec delayed_attr();
bool delayed(const Attrs& attrs);

// Validates the input dtype, the range and the scope; returns (scale f32, zero_point i32).
std::vector<TensorType> infer_observer_outputs(const InferContext& ctx);

// The state entries every observer ends with.
void append_common_states(std::vector<StateSpec>& states);

// Indices of the common states for an op whose own states number `own`.
struct CommonStates {
  int64_t* nonfinite = nullptr;
  bool enabled = false;
};
CommonStates common_states(KernelContext& ctx, size_t own);

// True when statistics may change: training mode, the observer_enabled flag set, and a
// non-empty input.
bool should_update(const KernelContext& ctx, const CommonStates& s);

// Data parallelism (device/communicator.h). An observer's statistics must come out as one
// process observing the concatenation of every rank's shard would leave them, bit for bit, so
// that every rank quantizes with the same qparams and keeps the same state:
//  * min/max ranges are all-reduced as ordered integer keys (MIN / MAX: exact, order-free);
//  * histogram and percentile observers gather every rank's finite values in rank order and
//    update from the concatenation (their bins are not a reduction of per-rank bins);
//  * non-finite counts are summed.
// Scopes whose qparams are indexed by rows of axis 0, the batch axis (token; group, whose
// qparams run over the rows before its axis; channel on axis 0), are not synced: those
// qparams belong to the rows of this rank's own shard. (Weights, the usual owners of group
// scopes, are identical on every rank anyway.)
// Whether to sync depends only on what is identical on every rank (training flag,
// observer_enabled, shapes), so every rank calls the same collectives.
// An observer whose `replicated` attribute is set (weights: the same on every rank, so the
// statistics are already the global ones) does not sync either.
// The communicator the observer syncs through in this call, or null (one process, sync off,
// a scope of rows, a replicated input). `replicated`: the observer's own flag, for a fused
// node whose parsed arguments are not the observer's.
Communicator* observer_sync(const KernelContext& ctx, const ScopeLayout& l);
Communicator* observer_sync(const KernelContext& ctx, const ScopeLayout& l, bool replicated);
// Sums this step's non-finite count (the state's growth since `before`) over the ranks.
void sync_nonfinite(Communicator& comm, int64_t* nonfinite, int64_t before);
// Replaces each rank's per-channel finite values by the ranks' concatenation.
void sync_values(Communicator& comm, std::vector<std::vector<float>>& values);

// CUDA ranks, for the histogram and percentile observers: every rank's input gathered in rank
// order (one all-gather on `stream`), which is the global batch one process would observe,
// and its layout. The synced scopes (tensor, and channel off axis 0) count axis 0 in their
// outer extent, so the concatenation along axis 0 has the same qparams and `ranks` times the
// outer extent. Observing it on each rank leaves every rank the state of that one process.
struct GatheredInput {
  Tensor x;
  ScopeLayout layout;
};
GatheredInput gather_input(Communicator& comm, const Tensor& x, const ScopeLayout& l, void* stream);

// Calls fn(channel, value_f32) for each finite element in memory order and counts the
// non-finite ones (after the cast to f32, as PyTorch casts to its f32 statistics).
template <typename Fn>
void for_each_finite(const std::string& op, const Tensor& x, const ScopeLayout& l,
                     int64_t* nonfinite, Fn&& fn) {
  dispatch_float(x.dtype(), op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    int64_t k = 0;
    for (int64_t o = 0; o < l.outer; ++o)
      for (int64_t a = 0; a < l.axis_len; ++a)
        for (int64_t i = 0; i < l.inner; ++i, ++k) {
          float v = static_cast<float>(px[k]);
          if (!qmath::is_finite(v)) {
            ++*nonfinite;
            continue;
          }
          fn(qparam_index(l, o, a, i), v);
        }
  });
}

// Folds this batch's finite values into the per-qparams ranges mn/mx (ordered_min /
// ordered_max: -0 below +0) and counts the non-finite ones, on the thread pool. Each chunk
// keeps its ranges as ordered integer keys and merges them with atomic min/max, so the result
// is the sequential loop's whatever the thread count.
void fold_finite_range(const std::string& op, const Tensor& x, const ScopeLayout& l,
                       int64_t* nonfinite, float* mn, float* mx);

// Per-channel running min/max of this batch's finite values (+inf/-inf where a channel
// has none).
void batch_min_max(const std::string& op, const Tensor& x, const ScopeLayout& l, int64_t* nonfinite,
                   std::vector<float>& mn, std::vector<float>& mx);

// The finite values of each channel, in memory order.
std::vector<std::vector<float>> gather_finite(const std::string& op, const Tensor& x,
                                              const ScopeLayout& l, int64_t* nonfinite);

// Writes scale[q], zero_point[q] from per-channel ranges; `valid[q]` false gives (1, 0).
void write_qparams(KernelContext& ctx, const std::vector<float>& mn, const std::vector<float>& mx,
                   const std::vector<bool>& valid);

// Throws unless lo < value <= hi, naming the op, the attribute and the value.
void check_real_in(const std::string& op, const std::string& attr, double value, double lo,
                   double hi);

}  // namespace qg
