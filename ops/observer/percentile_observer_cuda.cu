// CUDA kernel for percentile_observer, following percentile_histogram.h step by step on the
// device (no host synchronisation; the histogram, its range and the flags stay on the GPU):
// 1. blocks reduce fixed stretches of each channel to the batch's finite [min(v,0), max(v,0)]
//    (|x| for the symmetric scheme) and counts;
// 2. one block per channel initialises the range or grows it (width doubling, old bins
//    merged in pairs into a scratch copy: no atomics);
// 3. every finite value adds 1 to its bin (integer atomics: the counts are exact and so
//    independent of the order);
// 4. one thread per channel reads the percentiles and writes the range and qparams.
// min/max are exact and counts are integers, so every output matches the CPU bit for bit.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_math.h"

namespace qg {
namespace {

using namespace cuda;

constexpr int kThreads = 256;

struct Batch {
  double vmin, vmax;  // start at +0: the CPU's std::min/max from 0.0 never yield -0
  unsigned long long finite, nonfinite;
};
struct CombineBatch {
  __device__ Batch operator()(Batch a, Batch b) const {
    return {b.vmin < a.vmin ? b.vmin : a.vmin, a.vmax < b.vmax ? b.vmax : a.vmax,
            a.finite + b.finite, a.nonfinite + b.nonfinite};
  }
};

struct PArgs {
  ScopeDims d;
  int64_t per_q, splits, chunk, bins;
  bool symmetric, update;
  const uint8_t* enabled;
  int64_t* counts;
  double* lo;
  double* width;
  uint8_t* initialized;
  unsigned long long* nonfinite;
};

template <typename T>
__device__ __forceinline__ bool finite_value(const T* x, int64_t k, bool symmetric, float& v) {
  v = static_cast<float>(to_math(x[k]));
  if (!qmath::is_finite(v)) return false;
  if (symmetric) v = fabsf(v);
  return true;
}

template <typename T>
__global__ void batch_range_kernel(const T* x, PArgs a, Batch* partial) {
  if (*a.enabled == 0) return;
  for (int64_t b = blockIdx.x; b < a.d.num_qparams * a.splits; b += gridDim.x) {
    int64_t q = b / a.splits, s = b % a.splits;
    int64_t lo = s * a.chunk, hi = lo + a.chunk < a.per_q ? lo + a.chunk : a.per_q;
    Batch p{0.0, 0.0, 0ull, 0ull};
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
      int64_t k;
      if (!scope_element(a.d, q, r, k)) break;
      float v;
      if (!finite_value(x, k, a.symmetric, v)) {
        ++p.nonfinite;
        continue;
      }
      p = CombineBatch{}(p, Batch{static_cast<double>(v), static_cast<double>(v), 1ull, 0ull});
    }
    Batch total = block_reduce(p, CombineBatch{});
    if (threadIdx.x == 0) partial[b] = total;
  }
}

// One block per channel: fold the partials, then initialise or grow the histogram range.
__global__ void grow_kernel(const Batch* partial, int64_t* scratch, PArgs a) {
  if (!a.update || *a.enabled == 0) return;
  __shared__ Batch batch;
  __shared__ bool fits;
  for (int64_t q = blockIdx.x; q < a.d.num_qparams; q += gridDim.x) {
    int64_t* counts = a.counts + q * a.bins;
    int64_t* tmp = scratch + static_cast<int64_t>(blockIdx.x) * a.bins;
    if (threadIdx.x == 0) {
      batch = Batch{0.0, 0.0, 0ull, 0ull};
      for (int64_t s = 0; s < a.splits; ++s)
        batch = CombineBatch{}(batch, partial[q * a.splits + s]);
      if (batch.nonfinite) atomicAdd(a.nonfinite, batch.nonfinite);
    }
    __syncthreads();
    if (batch.finite == 0) {
      __syncthreads();
      continue;
    }
    if (!a.initialized[q]) {
      for (int64_t i = threadIdx.x; i < a.bins; i += blockDim.x) counts[i] = 0;
      if (threadIdx.x == 0) {
        a.lo[q] = batch.vmin;
        double span = batch.vmax - batch.vmin;
        a.width[q] = (span > 0.0 ? span : 1.0) / static_cast<double>(a.bins);
        a.initialized[q] = 1;
      }
    }
    __syncthreads();
    while (true) {
      if (threadIdx.x == 0)
        fits = batch.vmin >= a.lo[q] &&
               batch.vmax <= a.lo[q] + static_cast<double>(a.bins) * a.width[q];
      __syncthreads();
      if (fits) break;
      // Doubles the width, shifting the range left by m new bins (grow_once on the CPU).
      double w2 = 2.0 * a.width[q];
      double need = ceil((a.lo[q] - batch.vmin) / w2);
      double half = static_cast<double>(a.bins / 2);
      int64_t m = need > 0.0 ? static_cast<int64_t>(need < half ? need : half) : 0;
      for (int64_t j = threadIdx.x; j < a.bins; j += blockDim.x) {
        int64_t i = 2 * (j - m);
        int64_t c = 0;
        if (j >= m && i < a.bins) c = counts[i] + (i + 1 < a.bins ? counts[i + 1] : 0);
        tmp[j] = c;
      }
      __syncthreads();
      for (int64_t j = threadIdx.x; j < a.bins; j += blockDim.x) counts[j] = tmp[j];
      if (threadIdx.x == 0) {
        a.lo[q] = a.lo[q] - static_cast<double>(m) * w2;
        a.width[q] = w2;
      }
      __syncthreads();
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void accumulate_kernel(const T* x, int64_t n, PArgs a) {
  if (!a.update || *a.enabled == 0) return;
  for (int64_t k = global_thread(); k < n; k += global_stride()) {
    float v;
    if (!finite_value(x, k, a.symmetric, v)) continue;
    int64_t q = qparam_of(a.d, k);
    int64_t bin = obsmath::percentile_bin(static_cast<double>(v), a.lo[q], a.width[q], a.bins);
    atomicAdd(reinterpret_cast<unsigned long long*>(a.counts + q * a.bins + bin), 1ull);
  }
}

// percentile_histogram_value() of the CPU: the value below which a mass `mass` lies.
__device__ double histogram_value(const int64_t* counts, int64_t bins, double lo, double width,
                                  double mass) {
  int64_t before = 0;
  for (int64_t k = 0; k < bins; ++k) {
    int64_t c = counts[k];
    if (c == 0) continue;
    if (static_cast<double>(before + c) >= mass) {
      double frac = (mass - static_cast<double>(before)) / static_cast<double>(c);
      frac = frac > 0.0 ? frac : 0.0;
      return lo + width * (static_cast<double>(k) + frac);
    }
    before += c;
  }
  return lo + width * static_cast<double>(bins);
}

__global__ void finish_kernel(PArgs a, double p, qmath::QParamsConfig cfg, float* scale,
                              int32_t* zp, float* range_min, float* range_max) {
  for (int64_t q = global_thread(); q < a.d.num_qparams; q += global_stride()) {
    const int64_t* counts = a.counts + q * a.bins;
    bool valid = a.initialized[q] != 0;
    float lo = 0.0f, hi = 0.0f;
    if (valid) {
      int64_t total = 0;
      for (int64_t i = 0; i < a.bins; ++i) total += counts[i];
      double t = static_cast<double>(total);
      double top = histogram_value(counts, a.bins, a.lo[q], a.width[q], p / 100.0 * t);
      double bottom = a.symmetric ? -top
                                  : histogram_value(counts, a.bins, a.lo[q], a.width[q],
                                                    (100.0 - p) / 100.0 * t);
      lo = static_cast<float>(bottom < top ? bottom : top);
      hi = static_cast<float>(bottom < top ? top : bottom);
    }
    range_min[q] = lo;
    range_max[q] = hi;
    qmath::QParams qp = qmath::qparams_from_range(lo, hi, valid, cfg);
    scale[q] = qp.scale;
    zp[q] = qp.zero_point;
  }
}

void percentile_observer_cuda(KernelContext& ctx) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  QG_CHECK(ctx.states.size() == 6, ctx.op, "expected 6 state tensors, got ", ctx.states.size());
  // Data parallel: every rank observes the global batch itself (gather_input), as one process
  // would: the histogram's range and bins are not a reduction of per-rank ones.
  GatheredInput global{ctx.inputs[0], args.layout};
  if (Communicator* comm = ctx.training ? observer_sync(ctx, args.layout) : nullptr)
    global = gather_input(*comm, ctx.inputs[0], args.layout, ctx.device.stream());
  const Tensor& x = global.x;
  const ScopeLayout& l = global.layout;
  double p = args.percentile;
  QG_CHECK(p > 0 && p <= 100, ctx.op, "attribute 'percentile' = ", p, " is outside (0, 100]");
  PArgs a{};
  a.d = scope_dims(l);
  a.per_q = elements_per_qparam(a.d);
  a.splits = reduction_splits(a.d.num_qparams, a.per_q, kThreads);
  a.chunk = a.per_q == 0 ? 1 : (a.per_q + a.splits - 1) / a.splits;
  a.bins = args.bins;
  a.symmetric = args.symmetric;
  a.update = ctx.training && x.numel() > 0;
  a.enabled = in_ptr<uint8_t>(ctx.states[5]);
  a.counts = out_ptr<int64_t>(ctx.states[0]);
  a.lo = out_ptr<double>(ctx.states[1]);
  a.width = out_ptr<double>(ctx.states[2]);
  a.initialized = out_ptr<uint8_t>(ctx.states[3]);
  a.nonfinite = out_ptr<unsigned long long>(ctx.states[4]);
  int64_t nq = a.d.num_qparams;
  auto s = cuda_stream(ctx.device);
  if (a.update && nq > 0) {
    Tensor partial =
        Tensor::empty({nq * a.splits * static_cast<int64_t>(sizeof(Batch))}, DType::u8, x.device());
    int64_t blocks = nq * a.splits;
    unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
    unsigned grow_blocks = static_cast<unsigned>(nq < 4096 ? nq : 4096);
    Tensor scratch = Tensor::empty({int64_t{grow_blocks} * a.bins}, DType::i64, x.device());
    dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
      using T = decltype(tag);
      batch_range_kernel<T><<<grid, kThreads, 0, s>>>(in_ptr<T>(x), a, out_ptr<Batch>(partial));
      QG_CUDA_CHECK_LAUNCH(ctx.op);
      grow_kernel<<<grow_blocks, kThreads, 0, s>>>(in_ptr<Batch>(partial),
                                                   out_ptr<int64_t>(scratch), a);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
      auto shape = elementwise_launch(x.numel());
      accumulate_kernel<T><<<shape.blocks, shape.threads, 0, s>>>(in_ptr<T>(x), x.numel(), a);
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
  }
  if (nq == 0) return;
  auto shape = elementwise_launch(nq, 128);
  finish_kernel<<<shape.blocks, shape.threads, 0, s>>>(
      a, p, args.cfg, out_ptr<float>(ctx.outputs[0]), out_ptr<int32_t>(ctx.outputs[1]),
      out_ptr<float>(ctx.outputs[2]), out_ptr<float>(ctx.outputs[3]));
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_percentile_observer_cuda_kernels(OpRegistry& r) {
  r.get_mutable("percentile_observer")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, percentile_observer_cuda});
}

}  // namespace qg
