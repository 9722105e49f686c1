// CUDA kernels for minmax_observer and moving_average_observer. The batch statistics are a
// deterministic two-pass reduction: blocks reduce fixed stretches of one channel's elements
// to (min, max, nonfinite count) partials; one thread per channel then folds the partials
// into the device-resident state and writes (scale, zero_point) with the shared
// qmath::qparams_from_range. Min and max use the CPU's order-independent ordered_min/max, so
// even the sign of a zero statistic matches. The observer_enabled flag is read on the device.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/observer/observer_math.h"

namespace qg {
namespace {

using namespace cuda;

struct Part {
  float mn, mx;
  unsigned long long nonfinite;
};

__device__ __forceinline__ Part identity_part() {
  return {INFINITY, -INFINITY, 0ull};
}

// obsmath::ordered_min/max (-0 below +0) are commutative and associative, so any fixed
// reduction order gives the CPU's result, signed zeros included.
struct CombineParts {
  __device__ Part operator()(Part a, Part b) const {
    return {obsmath::ordered_min(a.mn, b.mn), obsmath::ordered_max(a.mx, b.mx),
            a.nonfinite + b.nonfinite};
  }
};

struct ObserveArgs {
  ScopeDims d;
  int64_t per_q;  // elements per channel (all of them per tensor)
  int64_t splits, chunk;
  const uint8_t* enabled;
};

template <typename T>
__global__ void observe_partial_kernel(const T* x, ObserveArgs a, Part* partial) {
  if (*a.enabled == 0) return;
  for (int64_t b = blockIdx.x; b < a.d.num_qparams * a.splits; b += gridDim.x) {
    int64_t q = b / a.splits, s = b % a.splits;
    int64_t lo = s * a.chunk, hi = lo + a.chunk < a.per_q ? lo + a.chunk : a.per_q;
    Part p = identity_part();
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
      int64_t k;
      if (!scope_element(a.d, q, r, k)) break;
      float v = static_cast<float>(to_math(x[k]));  // the f32 statistics, as on the CPU
      if (!qmath::is_finite(v)) {
        ++p.nonfinite;
        continue;
      }
      p.mn = obsmath::ordered_min(p.mn, v);
      p.mx = obsmath::ordered_max(p.mx, v);
    }
    Part total = block_reduce(p, CombineParts{});
    if (threadIdx.x == 0) partial[b] = total;
  }
}

struct FinishArgs {
  int64_t nq, splits;
  bool update;  // training mode and a non-empty input (host-side facts)
  const uint8_t* enabled;
  float* mn;
  float* mx;
  uint8_t* initialized;  // moving average only
  unsigned long long* nonfinite;
  float c;  // averaging constant
  qmath::QParamsConfig cfg;
  float* scale;
  int32_t* zp;
};

template <bool kMovingAverage>
__global__ void observe_finish_kernel(const Part* partial, FinishArgs a) {
  const bool up = a.update && *a.enabled != 0;
  for (int64_t q = global_thread(); q < a.nq; q += global_stride()) {
    if (up) {
      Part p = identity_part();
      for (int64_t s = 0; s < a.splits; ++s) p = CombineParts{}(p, partial[q * a.splits + s]);
      if (p.nonfinite) atomicAdd(a.nonfinite, p.nonfinite);
      if (kMovingAverage) {
        if (p.mn <= p.mx) {
          if (a.initialized[q]) {
            a.mn[q] = obsmath::moving_average(a.mn[q], p.mn, a.c);
            a.mx[q] = obsmath::moving_average(a.mx[q], p.mx, a.c);
          } else {
            a.mn[q] = p.mn;
            a.mx[q] = p.mx;
            a.initialized[q] = 1;
          }
        }
      } else {
        Part st{a.mn[q], a.mx[q], 0ull};
        Part r = CombineParts{}(st, p);
        a.mn[q] = r.mn;
        a.mx[q] = r.mx;
      }
    }
    bool valid = kMovingAverage ? a.initialized[q] != 0 : a.mn[q] <= a.mx[q];
    qmath::QParams qp = qmath::qparams_from_range(a.mn[q], a.mx[q], valid, a.cfg);
    a.scale[q] = qp.scale;
    a.zp[q] = qp.zero_point;
  }
}

template <bool kMovingAverage>
void observer_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  ScopeLayout l = scope_layout(ctx.op, ctx.attrs, x.shape());
  size_t own = kMovingAverage ? 3 : 2;
  QG_CHECK(ctx.states.size() == own + 2, ctx.op, "expected ", own + 2, " state tensors, got ",
           ctx.states.size());
  auto s = static_cast<cudaStream_t>(ctx.stream);
  const int threads = 256;
  int64_t nq = l.num_qparams;
  bool update = ctx.training && x.numel() > 0;
  ObserveArgs oa{scope_dims(l), 0, 1, 1, in_ptr<uint8_t>(ctx.states[own + 1])};
  oa.per_q = elements_per_qparam(oa.d);
  oa.splits = reduction_splits(nq, oa.per_q, threads);
  oa.chunk = oa.per_q == 0 ? 1 : (oa.per_q + oa.splits - 1) / oa.splits;
  Tensor partial;
  if (update) {
    partial =
        Tensor::empty({nq * oa.splits * static_cast<int64_t>(sizeof(Part))}, DType::u8, x.device());
    int64_t blocks = nq * oa.splits;
    unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
    dispatch_float(x.dtype(), ctx.op, [&](auto tag) {
      using T = decltype(tag);
      observe_partial_kernel<T><<<grid, threads, 0, s>>>(in_ptr<T>(x), oa, out_ptr<Part>(partial));
      QG_CUDA_CHECK_LAUNCH(ctx.op);
    });
  }
  FinishArgs fa{};
  fa.nq = nq;
  fa.splits = oa.splits;
  fa.update = update;
  fa.enabled = oa.enabled;
  fa.mn = out_ptr<float>(ctx.states[0]);
  fa.mx = out_ptr<float>(ctx.states[1]);
  fa.initialized = kMovingAverage ? out_ptr<uint8_t>(ctx.states[2]) : nullptr;
  fa.nonfinite = out_ptr<unsigned long long>(ctx.states[own]);
  if (kMovingAverage) {
    double c = ctx.attrs.get_real("averaging_constant");
    QG_CHECK(c > 0 && c <= 1, ctx.op, "attribute 'averaging_constant' = ", c, " is outside (0, 1]");
    fa.c = static_cast<float>(c);
  }
  fa.cfg = qparams_config_from_attrs(ctx.op, ctx.attrs);
  fa.scale = out_ptr<float>(ctx.outputs[0]);
  fa.zp = out_ptr<int32_t>(ctx.outputs[1]);
  auto shape = elementwise_launch(nq);
  observe_finish_kernel<kMovingAverage>
      <<<shape.blocks, shape.threads, 0, s>>>(update ? in_ptr<Part>(partial) : nullptr, fa);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

const std::vector<DType> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

void add_observer_cuda_kernels(OpRegistry& r) {
  r.get_mutable("minmax_observer")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, observer_cuda<false>});
  r.get_mutable("moving_average_observer")
      .kernels.push_back({DeviceType::cuda, kFloatTypes, observer_cuda<true>});
}

}  // namespace qg
