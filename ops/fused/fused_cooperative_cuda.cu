// The launchers of the cooperative fused observer + quantizer kernels
// (ops/fused/fused_cooperative.cuh): per tensor, per channel on the last axis, per channel on
// a middle axis.
#include "ops/fused/fused_cooperative.cuh"

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
    constexpr int N = kVec<T>;
    const int64_t n = x.numel();
    if (n == 0 || n % (32 * N) != 0 || n / N >= kMaxPacks || inner % N != 0) return false;
    const int64_t packs = n / N, channel_packs = inner / N, row_packs = channels * channel_packs;
    using Coop = Cooperative<decltype(codes_tag)::value, T, MiddleStats<T>>;
    typename Coop::RowPlan p;
    if (!Coop::plan_rows(packs, row_packs, channels, p)) return false;
    int group = 1;
    while (group < 32 && channel_packs % (group * 2) == 0) group *= 2;
    Tensor partials = scratch_bytes(ctx, p.threads / group * int64_t{sizeof(ColumnMinMax)});
    launch_cooperative(Coop::kernel, static_cast<unsigned>(p.blocks), p.smem_packs, in_ptr<T>(x),
                       ctx, packs,
                       typename MiddleStats<T>::Scratch{out_ptr<ColumnMinMax>(partials), channels,
                                                        channel_packs, group, p.lanes},
                       a);
    return true;
  });
}

}  // namespace qg::cuda::fused
