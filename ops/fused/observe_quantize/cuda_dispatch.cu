// Single-kernel CUDA paths for fused observer + fake_quantize (or + quantize, writing s8/u8
// codes), bit-identical to the unfused graph and free of host synchronisation (statistics,
// flags and qparams stay on the device). This file picks the path for the node's layout:
//
//  | layout                                              | kernel (file)                    |
//  | per tensor                                          | cooperative grid, grid barrier   |
//  |                                                     | (cuda_cooperative_launch.cu)      |
//  | per tensor, delayed                                 | one pass, last block folds       |
//  |                                                     | (cuda_delayed_tensor.cu)          |
//  | channel on the outermost axis, token, group on the  | one block or warp per row        |
//  | innermost axis (dividing it)                        | (cuda_rows.cu)             |
//  | channel on the last axis of [rows, C]               | cooperative grid, two barriers   |
//  |                                                     | (cuda_cooperative_launch.cu)      |
//  | per tensor, relu/gelu/silu applied on load          | cooperative grid, grid barrier   |
//  |                                                     | (cuda_activation_prologue.cu)         |
//  | channel on a middle axis of [outer, C, inner], with | cooperative grid: a row map (two |
//  | inner a multiple of the pack, and a row (C * inner) | barriers) or a channel-major map |
//  | within the resident grid's threads or runs of a     | (one barrier), fused_cooperative |
//  | multiple of 32 packs with 32 threads per channel    | _middle.cuh                      |
//
// Every kernel computes its statistics from the raw bits and quantizes without NaN selects
// for the threads whose elements are all finite (the common case), and keeps the exact
// per-element code for the others (cuda_fast_path.cuh).
//
// Data parallelism (observer_common.h): a per-tensor node whose statistics sync combines the
// ranks' ranges inside its kernel, through the peer mailbox (peer_combine), so it keeps its
// single pass; every other synced node, and every synced node without a mailbox, runs its
// parts, whose observer kernel syncs.
//
// Anything else (f64, channels on a middle axis whose inner run is not whole packs or whose
// outer row exceeds the resident grid while the channel-major map does not apply, tail
// groups, lengths that break 32-bit mask words, unaligned buffers) runs the two original
// kernels back to back.
#include "core/graph.h"
#include "ops/fused/observe_quantize/cuda_stats_and_store.cuh"
#include "ops/fused/observe_quantize/observe_quantize.h"
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"

namespace qg {
namespace {

using namespace cuda;
using namespace cuda::fused;

// The node's parsed arguments and state tensors as the kernels' argument block; `peers`: the
// mailbox the statistics sync through, or null.
FusedArgs make_args(KernelContext& ctx, const PeerMailbox* peers) {
  const ObserveQuantizeArgs& p = ctx.args<ObserveQuantizeArgs>();
  FusedArgs a{};
  a.moving_average = p.moving_average;
  a.averaging_constant = p.averaging_constant;
  a.training = ctx.training;
  a.delayed = p.delayed;
  a.cfg = p.cfg;
  a.qmin = static_cast<float>(p.range.qmin);
  a.qmax = static_cast<float>(p.range.qmax);
  size_t s = 0;
  a.st_min = out_ptr<float>(ctx.states.at(s++));
  a.st_max = out_ptr<float>(ctx.states.at(s++));
  a.st_init = a.moving_average ? out_ptr<uint8_t>(ctx.states.at(s++)) : nullptr;
  a.nonfinite = out_ptr<unsigned long long>(ctx.states.at(s++));
  a.observer_enabled = out_ptr<uint8_t>(ctx.states.at(s++));
  a.fake_quant_enabled = s < ctx.states.size() ? out_ptr<uint8_t>(ctx.states.at(s)) : nullptr;
  a.scale_out = out_ptr<float>(ctx.outputs[2]);
  a.zp_out = out_ptr<int32_t>(ctx.outputs[3]);
  a.err = error_record(ctx.device);
  a.node = ctx.site;
  if (peers != nullptr) a.peers = *peers;
  return a;
}

// The communicator this call's statistics sync through, or null (no sync, or no update: not
// training, or an empty x; the same on every rank).
Communicator* statistics_sync(const KernelContext& ctx) {
  if (!ctx.training || ctx.inputs[0].numel() == 0) return nullptr;
  const ObserveQuantizeArgs& p = ctx.args<ObserveQuantizeArgs>();
  return observer_sync(ctx, p.layout, ctx.part(0).args<ObserverArgs>().replicated);
}

// The scopes whose qparams each cover one contiguous row of x, in qparam order: channels of
// the outermost axis, tokens, and groups along the innermost axis that divide it evenly.
bool contiguous_rows(const ScopeLayout& l, int64_t& rows, int64_t& row_len) {
  switch (l.kind) {
    case ScopeKind::channel:
      if (l.outer != 1) return false;
      rows = l.axis_len;
      row_len = l.inner;
      return true;
    case ScopeKind::token:
      rows = l.outer;
      row_len = l.axis_len * l.inner;
      return true;
    case ScopeKind::group:
      if (l.inner != 1 || l.axis_len % l.group_size != 0) return false;
      rows = l.outer * l.num_groups;
      row_len = l.group_size;
      return true;
    default:
      return false;
  }
}

// Picks a single-kernel path when one applies; returns false to fall back.
bool try_single_kernel(KernelContext& ctx, const PeerMailbox* peers) {
  const ObserveQuantizeArgs& p = ctx.args<ObserveQuantizeArgs>();
  const bool codes = p.codes;
  const Tensor& x = ctx.inputs[0];
  if (!aligned16(x.raw_data()) || !aligned16(ctx.outputs[0].raw_data()) ||
      (reinterpret_cast<uintptr_t>(ctx.outputs[1].raw_data()) & 3u) != 0)
    return false;
  const ScopeLayout& l = p.layout;
  const FusedArgs a = make_args(ctx, peers);
  if (l.kind == ScopeKind::tensor)
    return a.delayed ? launch_fused_tensor_delayed(ctx, a, codes)
                     : launch_fused_tensor(ctx, a, codes);
  int64_t rows = 0, row_len = 0;
  if (contiguous_rows(l, rows, row_len)) return launch_fused_rows(ctx, a, codes, rows, row_len);
  if (l.kind == ScopeKind::channel && l.inner == 1 && l.outer > 1)
    return launch_fused_columns(ctx, a, codes, l.axis_len);
  if (l.kind == ScopeKind::channel && l.inner > 1 && l.outer > 1)
    return launch_fused_middle(ctx, a, codes, l.axis_len, l.inner);
  return false;
}

// A node with an activation prologue (fuse_activation_prologue): the per-tensor
// fake-quantize kernel applies it on load; true when that kernel ran.
bool try_prologue_kernel(KernelContext& ctx, const KernelPart& activation,
                         const PeerMailbox* peers) {
  const ObserveQuantizeArgs& p = ctx.args<ObserveQuantizeArgs>();
  const Tensor& x = ctx.inputs[0];
  if (p.codes || !aligned16(x.raw_data()) || !aligned16(ctx.outputs[0].raw_data()) ||
      (reinterpret_cast<uintptr_t>(ctx.outputs[1].raw_data()) & 3u) != 0)
    return false;
  if (p.layout.kind != ScopeKind::tensor) return false;
  const FusedArgs a = make_args(ctx, peers);
  return !a.delayed && launch_fused_tensor_prologue(ctx, a, activation);
}

void fused_observe_quantize_cuda(KernelContext& ctx) {
  const Communicator* comm = statistics_sync(ctx);
  const PeerMailbox* peers = comm != nullptr ? comm->peer_mailbox() : nullptr;
  const bool single =
      comm == nullptr ||
      (peers != nullptr && ctx.args<ObserveQuantizeArgs>().layout.kind == ScopeKind::tensor);
  if (const KernelPart* act = prologue_activation(ctx.prepared)) {
    if (single && try_prologue_kernel(ctx, *act, peers)) return;
    apply_prologue(ctx, DeviceType::cuda);  // the activation into a temporary x
  }
  if (!single || !try_single_kernel(ctx, peers))
    run_fused_observe_quantize_composed(ctx, DeviceType::cuda);
}

}  // namespace

void add_fused_cuda_kernels(OpRegistry& r) {
  r.get_mutable("fused_observe_quantize")
      .kernels.push_back({DeviceType::cuda, {}, fused_observe_quantize_cuda});
}

}  // namespace qg
