// The launchers of the cooperative fused observer + quantizer kernels
// (ops/fused/observe_quantize/cuda_cooperative.cuh): per tensor, per channel on the last axis, per
// channel on a middle axis.

#include "ops/fused/observe_quantize/cuda_cooperative_middle_axis.cuh"
#include "ops/fused/observe_quantize/middle_map_launches.h"

namespace qg::cuda::fused {

using namespace coop;

bool launch_fused_tensor(KernelContext& ctx, const FusedArgs& a, bool codes) {
  return dispatch_codes_dtype(codes, ctx.inputs[0].dtype(), [&](auto codes_tag, auto type_tag) {
    using T = typename decltype(type_tag)::type;
    return launch_tensor<decltype(codes_tag)::value, T, NoPrologue>(ctx, a);
  });
}

bool launch_fused_columns(KernelContext& ctx, const FusedArgs& a, bool codes, int64_t columns) {
  const Tensor& x = ctx.inputs[0];
  return dispatch_codes_dtype(codes, x.dtype(), [&](auto codes_tag, auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr int N = kVec<T>;
    const int64_t n = x.numel();
    if (n == 0 || n % (32 * N) != 0 || n / N >= kMaxPacks || columns % N != 0) return false;
    const int64_t packs = n / N, row_packs = columns / N;
    using Coop = Cooperative<decltype(codes_tag)::value, T, ColumnStats<T>>;
    typename Coop::RowPlan p;
    if (!Coop::plan_rows(packs, row_packs, columns, p)) return false;
    const int64_t sweeps = p.threads / row_packs;
    Tensor partials = scratch_bytes(ctx, sweeps * columns * int64_t{sizeof(ColumnMinMax)});
    launch_cooperative(
        Coop::kernel, static_cast<unsigned>(p.blocks), p.smem_packs, in_ptr<T>(x), ctx, packs,
        typename ColumnStats<T>::Scratch{out_ptr<ColumnMinMax>(partials), columns, p.lanes}, a);
    return true;
  });
}

bool launch_fused_middle(KernelContext& ctx, const FusedArgs& a, bool codes, int64_t channels,
                         int64_t inner) {
  const Tensor& x = ctx.inputs[0];
  return dispatch_codes_dtype(codes, x.dtype(), [&](auto codes_tag, auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr bool kCodes = decltype(codes_tag)::value;
    constexpr int N = kVec<T>;
    const int64_t n = x.numel();
    if (n == 0 || n % (32 * N) != 0 || n / N >= kMaxPacks || inner % N != 0) return false;
    const int64_t packs = n / N, channel_packs = inner / N, row_packs = channels * channel_packs;
    using Rows = Cooperative<kCodes, T, MiddleStats<T>>;
    using Channels = Cooperative<kCodes, T, ChannelMajorStats<T>>;
    typename Rows::RowPlan rows;
    ChannelPlan major;
    const bool rows_fit = Rows::plan_rows(packs, row_packs, channels, rows);
    const bool major_fits = plan_channel_major<Channels>(packs, channels, channel_packs, major);
    // The channel-major map when it runs more threads than the row map (or the row map does
    // not fit): more loads in flight and more of the on-chip cache. At equal threads the row
    // map wins, having no index arithmetic. H200, f32[128, 64, 64, 64]: 1.56x the copy with
    // the channel-major map and its single barrier, against 1.78x with the row map
    // (bench/results/fused_observe_quantize_tuning.md).
    const bool channel_major =
        major_fits && (!rows_fit || channels * major.channel_threads > rows.threads);
    if (channel_major) {
      const int64_t warps = channels * major.channel_threads / 32;
      Tensor partials = scratch_bytes(ctx, warps * int64_t{sizeof(ColumnMinMax)});
      typename ChannelMajorStats<T>::Scratch s{out_ptr<ColumnMinMax>(partials),
                                               static_cast<int>(channels),
                                               static_cast<int>(major.channel_threads),
                                               static_cast<int>(channel_packs),
                                               static_cast<int>(packs / channels),
                                               RunDivisor(static_cast<uint32_t>(channel_packs))};
      launch_cooperative(Channels::kernel, static_cast<unsigned>(major.blocks), major.smem_packs,
                         in_ptr<T>(x), ctx, packs, s, a);
      count_fused_middle_map_launch(true);
      return true;
    }
    if (!rows_fit) return false;
    int group = 1;
    while (group < 32 && channel_packs % (group * 2) == 0) group *= 2;
    Tensor partials = scratch_bytes(ctx, rows.threads / group * int64_t{sizeof(ColumnMinMax)});
    launch_cooperative(Rows::kernel, static_cast<unsigned>(rows.blocks), rows.smem_packs,
                       in_ptr<T>(x), ctx, packs,
                       typename MiddleStats<T>::Scratch{out_ptr<ColumnMinMax>(partials), channels,
                                                        channel_packs, group, rows.lanes},
                       a);
    count_fused_middle_map_launch(false);
    return true;
  });
}

}  // namespace qg::cuda::fused
