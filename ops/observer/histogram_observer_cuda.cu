// CUDA kernel for histogram_observer: PyTorch's HistogramObserver with the histogram, its
// range, the L2 search and the qparams on the device (no host synchronisation). It follows
// torch_histogram_math.h step by step, in five launches:
// 1. batch statistics (observer_reduce.cuh): each channel's finite min/max and the
//    non-finite count;
// 2. one thread per channel plans the range adjustment and updates min/max/initialized;
// 3. every finite value adds 1 to its bin over the planned range (integer atomics: counts
//    are exact, so the order does not matter; a shared-memory histogram per block for the
//    per-tensor scope, where all blocks hit the same bins);
// 4. one block per channel merges the counts with the old histogram (the f64 prefix sums
//    and the rebinning run sequentially on one thread, as on the CPU);
// 5. one 256-thread block per channel runs the L2 search: one thread walks the candidates,
//    the block sums each candidate's error in histmath's canonical lane order, and thread 0
//    writes the range and the qparams.
// Every step repeats the CPU's float operations in the CPU's order, so the histogram, the
// range and the qparams are identical to the CPU's. Data-parallel ranks observe every rank's
// input, gathered (observer_common.h: gather_input).
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_reduce.cuh"
#include "ops/observer/torch_histogram_math.h"

namespace qg {
namespace {

using namespace cuda;
using namespace histmath;

constexpr int kThreads = 256;
static_assert(kThreads == kL2Lanes, "the L2 search block sums one lane per thread");
// Bins a per-block shared-memory histogram may hold (u32 counts: 32 KiB).
constexpr int64_t kSharedBins = 8192;

struct HistState {
  int64_t nq, bins, upsample;
  float* hist;  // [nq, bins]
  float* mn;
  float* mx;
  uint8_t* initialized;
};

HistState hist_state(KernelContext& ctx, int64_t nq) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  return {nq,
          args.bins,
          args.upsample_rate,
          out_ptr<float>(ctx.states[0]),
          out_ptr<float>(ctx.states[1]),
          out_ptr<float>(ctx.states[2]),
          out_ptr<uint8_t>(ctx.states[3])};
}

__global__ void plan_kernel(const Part* partial, int64_t splits, const uint8_t* enabled,
                            unsigned long long* nonfinite, HistState h, HistPlan* plans) {
  const bool on = *enabled != 0;  // off: every channel plans kNone, so later steps skip it
  for (int64_t q = global_thread(); q < h.nq; q += global_stride()) {
    if (!on) {
      plans[q] = HistPlan{};
      continue;
    }
    Part p = identity_part();
    for (int64_t s = 0; s < splits; ++s) p = CombineParts{}(p, partial[q * splits + s]);
    if (p.nonfinite) atomicAdd(nonfinite, p.nonfinite);
    HistPlan plan;  // kNone
    if (p.mn <= p.mx) {
      plan = plan_histogram_update(p.mn, p.mx, h.initialized[q] != 0, h.mn[q], h.mx[q], h.bins,
                                   h.upsample);
      h.mn[q] = plan.new_min;
      h.mx[q] = plan.new_max;
      h.initialized[q] = 1;
    }
    plans[q] = plan;
  }
}

__device__ __forceinline__ bool binned(const HistPlan& p, float v, int64_t bins, int64_t& b) {
  if (p.mode == HistMode::kNone || !qmath::is_finite(v)) return false;
  b = obsmath::histc_bin(v, p.histc_lo, p.histc_hi, bins);
  return b >= 0;
}

// Per channel (or per tensor without shared memory): global 64-bit atomics.
template <typename T>
__global__ void histc_kernel(const T* x, int64_t n, ScopeDims d, const uint8_t* enabled,
                             const HistPlan* plans, int64_t bins, unsigned long long* counts) {
  if (*enabled == 0) return;
  for (int64_t k = global_thread(); k < n; k += global_stride()) {
    float v = static_cast<float>(to_math(x[k]));
    int64_t q = qparam_of(d, k), b;
    if (binned(plans[q], v, bins, b)) atomicAdd(counts + q * bins + b, 1ull);
  }
}

// Per tensor: each block counts into shared memory, then adds its non-zero bins once.
template <typename T>
__global__ void histc_shared_kernel(const T* x, int64_t n, const uint8_t* enabled,
                                    const HistPlan* plans, int64_t bins,
                                    unsigned long long* counts) {
  __shared__ unsigned int local[kSharedBins];
  if (*enabled == 0) return;
  const HistPlan plan = plans[0];
  if (plan.mode == HistMode::kNone) return;
  for (int64_t i = threadIdx.x; i < bins; i += blockDim.x) local[i] = 0;
  __syncthreads();
  // A block's stretch stays below 2^32 elements: u32 shared counts cannot overflow.
  for (int64_t k = global_thread(); k < n; k += global_stride()) {
    int64_t b;
    if (binned(plan, static_cast<float>(to_math(x[k])), bins, b)) atomicAdd(local + b, 1u);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < bins; i += blockDim.x)
    if (local[i]) atomicAdd(counts + i, static_cast<unsigned long long>(local[i]));
}

// Channels q = blockIdx.x, + gridDim.x, ...; `prefix` ([bins + 1] f64) and `old` ([bins]
// f32) are this block's scratch.
__global__ void merge_kernel(const HistPlan* plans, const unsigned long long* counts, HistState h,
                             double* prefix_all, float* old_all) {
  const int64_t bins = h.bins;
  double* prefix = prefix_all + blockIdx.x * (bins + 1);
  float* old = old_all + blockIdx.x * bins;
  for (int64_t q = blockIdx.x; q < h.nq; q += gridDim.x) {
    const HistPlan p = plans[q];
    if (p.mode == HistMode::kNone) continue;  // uniform over the block
    float* hist = h.hist + q * bins;
    const unsigned long long* c = counts + q * bins;
    if (p.mode == HistMode::kReplace || p.mode == HistMode::kAdd) {
      bool add = p.mode == HistMode::kAdd;
      for (int64_t i = threadIdx.x; i < bins; i += blockDim.x)
        hist[i] = add ? static_cast<float>(c[i]) + hist[i] : static_cast<float>(c[i]);
      __syncthreads();
      continue;
    }
    for (int64_t i = threadIdx.x; i < bins; i += blockDim.x) old[i] = hist[i];
    __syncthreads();
    if (p.mode == HistMode::kCombine) {
      if (threadIdx.x == 0) {  // prefix sums in index order, as the CPU forms them
        prefix[0] = 0.0;
        for (int64_t i = 0; i < bins; ++i) prefix[i + 1] = prefix[i] + old[i];
      }
      __syncthreads();
      for (int64_t j = threadIdx.x; j < bins; j += blockDim.x)
        hist[j] = static_cast<float>(c[j]) +
                  combined_bin(j, prefix, old, bins, h.upsample, p.down, p.start);
    } else {  // kRebin: several old bins can land in one new bin, so one thread adds in order
      for (int64_t i = threadIdx.x; i < bins; i += blockDim.x) hist[i] = static_cast<float>(c[i]);
      __syncthreads();
      if (threadIdx.x == 0)
        for (int64_t i = 0; i < bins; ++i)
          if (old[i] != 0.0f)
            hist[rebin_target(i, p.old_min, p.old_max, p.histc_lo, p.histc_hi, bins)] += old[i];
    }
    __syncthreads();
  }
}

struct SearchOut {
  int64_t dst_nbins;
  qmath::QParamsConfig cfg;
  float* scale;
  int32_t* zp;
  float* range_min;
  float* range_max;
};

// One kThreads block per channel; `csum_all` holds [bins] f32 per block.
__global__ void search_kernel(HistState h, float* csum_all, SearchOut o) {
  __shared__ L2Search s;
  __shared__ bool more;
  __shared__ double lanes[kL2Lanes];
  const int64_t bins = h.bins;
  float* csum = csum_all + blockIdx.x * bins;
  for (int64_t q = blockIdx.x; q < h.nq; q += gridDim.x) {
    const bool valid = h.initialized[q] != 0;
    const float* hist = h.hist + q * bins;
    if (valid) {
      if (threadIdx.x == 0) {
        double acc = 0.0;  // torch.cumsum accumulates f32 in f64
        for (int64_t i = 0; i < bins; ++i) {
          acc += hist[i];
          csum[i] = static_cast<float>(acc);
        }
        s = l2_search_begin(static_cast<double>(static_cast<float>(acc)), bins);
      }
      while (true) {
        __syncthreads();
        if (threadIdx.x == 0) more = l2_search_propose(s, csum);
        __syncthreads();
        if (!more) break;
        L2Error e = l2_error_setup(h.mn[q], h.mx[q], bins, o.dst_nbins, s.cand_start, s.cand_end);
        if (!e.zero) {
          lanes[threadIdx.x] = l2_lane_sum(e, hist, bins, static_cast<int>(threadIdx.x));
          __syncthreads();
          for (int stride = kL2Lanes / 2; stride > 0; stride /= 2) {
            if (threadIdx.x < stride)
              lanes[threadIdx.x] = lanes[threadIdx.x] + lanes[threadIdx.x + stride];
            __syncthreads();
          }
        }
        if (threadIdx.x == 0) {
          double norm = e.zero ? 0.0 : static_cast<double>(static_cast<float>(lanes[0]));
          more = l2_search_accept(s, norm);
        }
        __syncthreads();
        if (!more) break;
      }
    }
    if (threadIdx.x == 0) {
      float lo = 0.0f, hi = 0.0f;
      if (valid) {
        const float width = (h.mx[q] - h.mn[q]) / static_cast<float>(bins);
        lo = h.mn[q] + width * static_cast<float>(s.start);
        hi = h.mn[q] + width * static_cast<float>(s.end + 1);
      }
      o.range_min[q] = lo;
      o.range_max[q] = hi;
      qmath::QParams qp = qmath::qparams_from_range(lo, hi, valid, o.cfg);
      o.scale[q] = qp.scale;
      o.zp[q] = qp.zero_point;
    }
    __syncthreads();
  }
}

// Blocks for the per-channel kernels: at most one per channel, with scratch capped near
// 64 MiB however many bins there are.
unsigned channel_blocks(int64_t nq, int64_t bins) {
  int64_t by_scratch = (int64_t{64} << 20) / (bins * 12 + 8);
  int64_t g = nq < 1024 ? nq : 1024;
  if (g > by_scratch) g = by_scratch;
  return static_cast<unsigned>(g > 0 ? g : 1);
}

void histogram_observer_cuda(KernelContext& ctx) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  QG_CHECK(ctx.states.size() == 6, ctx.op, "expected 6 state tensors, got ", ctx.states.size());
  // Data parallel: the bins are not a reduction of per-rank bins, so every rank observes the
  // global batch itself (gather_input), as one process would.
  GatheredInput global{ctx.inputs[0], args.layout};
  if (Communicator* comm = ctx.training ? observer_sync(ctx, args.layout) : nullptr)
    global = gather_input(*comm, ctx.inputs[0], args.layout, ctx.device.stream());
  const Tensor& x = global.x;
  const ScopeLayout& l = global.layout;
  const int64_t nq = l.num_qparams;
  if (nq == 0) return;
  HistState h = hist_state(ctx, nq);
  const uint8_t* enabled = in_ptr<uint8_t>(ctx.states[5]);
  auto s = cuda_stream(ctx.device);
  const unsigned blocks = channel_blocks(nq, h.bins);
  const Device dev = x.device();
  if (ctx.training && x.numel() > 0) {
    ObserveArgs oa = observe_args(l, enabled, kThreads);
    Tensor partial = launch_observe_partials(ctx.op, x, oa, kThreads, s);
    Tensor plans = Tensor::empty({nq * static_cast<int64_t>(sizeof(HistPlan))}, DType::u8, dev);
    auto shape = elementwise_launch(nq, 128);
    plan_kernel<<<shape.blocks, shape.threads, 0, s>>>(in_ptr<Part>(partial), oa.splits, enabled,
                                                       out_ptr<unsigned long long>(ctx.states[4]),
                                                       h, out_ptr<HistPlan>(plans));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
    Tensor counts = Tensor::empty({nq * h.bins}, DType::i64, dev);
    QG_CUDA_CHECK(ctx.op, cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), s));
    auto* cp = out_ptr<unsigned long long>(counts);
    const HistPlan* pp = in_ptr<HistPlan>(plans);
    dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
      using T = decltype(tag);
      auto ew = elementwise_launch(x.numel());
      // Enough blocks to fill the device, each with a stretch below 2^32 elements.
      const int64_t grid = 4 * multiprocessor_count();
      if (nq == 1 && h.bins <= kSharedBins && x.numel() / grid < (int64_t{1} << 31)) {
        histc_shared_kernel<T><<<static_cast<unsigned>(grid), kThreads, 0, s>>>(
            in_ptr<T>(x), x.numel(), enabled, pp, h.bins, cp);
      } else {
        histc_kernel<T><<<ew.blocks, ew.threads, 0, s>>>(in_ptr<T>(x), x.numel(), oa.d, enabled, pp,
                                                         h.bins, cp);
      }
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
    Tensor prefix = Tensor::empty({int64_t{blocks} * (h.bins + 1)}, DType::f64, dev);
    Tensor old = Tensor::empty({int64_t{blocks} * h.bins}, DType::f32, dev);
    merge_kernel<<<blocks, kThreads, 0, s>>>(pp, cp, h, out_ptr<double>(prefix),
                                             out_ptr<float>(old));
    QG_CUDA_CHECK_LAUNCH(ctx.op);
  }
  Tensor csum = Tensor::empty({int64_t{blocks} * h.bins}, DType::f32, dev);
  SearchOut o{args.dst_nbins,
              args.cfg,
              out_ptr<float>(ctx.outputs[0]),
              out_ptr<int32_t>(ctx.outputs[1]),
              out_ptr<float>(ctx.outputs[2]),
              out_ptr<float>(ctx.outputs[3])};
  search_kernel<<<blocks, kThreads, 0, s>>>(h, out_ptr<float>(csum), o);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_histogram_observer_cuda_kernels(OpRegistry& r) {
  r.get_mutable("histogram_observer")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, histogram_observer_cuda});
}

}  // namespace qg
