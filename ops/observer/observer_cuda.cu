// CUDA kernels for minmax_observer and moving_average_observer. The batch statistics are a
// deterministic two-pass reduction (observer_reduce.cuh); one thread per channel then folds
// the partials into the device-resident state and writes (scale, zero_point) with the shared
// qmath::qparams_from_range. The observer_enabled flag is read on the device.
//
// Data parallelism (observer_common.h): between the two, the partials of every rank are
// combined. The partials are collapsed to one range per channel as ordered integer keys
// (max negated) and a non-finite count, gathered from every rank, and combined (MIN, SUM)
// back into the partials the finish kernel reads, so it folds the global batch's range.
// Integer MIN is exact and order-free: every rank gets one process's bits.
// Where the ranks share a host with peer access (Communicator::peer_mailbox), the collapse,
// the exchange and the expansion are one kernel writing into the peers' mailboxes; otherwise
// two kernels around an NCCL all-gather.
#include "core/graph.h"
#include "ops/common/cuda_common.cuh"
#include "ops/common/peer_exchange.cuh"
#include "ops/common/quant_attrs.h"
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_math.h"
#include "ops/observer/observer_reduce.cuh"

namespace qg {
namespace {

using namespace cuda;

struct FinishArgs {
  int64_t nq, splits;
  bool update;  // training mode and a non-empty input (host-side facts)
  const uint8_t* enabled;
  float* mn;
  float* mx;
  uint8_t* initialized;  // moving average only
  unsigned long long* nonfinite;
  float c;       // averaging constant
  bool delayed;  // qparams from the state before this batch
  qmath::QParamsConfig cfg;
  float* scale;
  int32_t* zp;
};

template <bool kMovingAverage>
__global__ void observe_finish_kernel(const Part* partial, FinishArgs a) {
  const bool up = a.update && *a.enabled != 0;
  for (int64_t q = global_thread(); q < a.nq; q += global_stride()) {
    auto write_qparams = [&] {
      bool valid = kMovingAverage ? a.initialized[q] != 0 : a.mn[q] <= a.mx[q];
      qmath::QParams qp = qmath::qparams_from_range(a.mn[q], a.mx[q], valid, a.cfg);
      a.scale[q] = qp.scale;
      a.zp[q] = qp.zero_point;
    };
    if (a.delayed) write_qparams();
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
    if (!a.delayed) write_qparams();
  }
}

// One rank's contribution, as int64 [2 nq + 1]: the ordered key of channel q's minimum at q,
// the negated key of its maximum at nq + q, the batch's non-finite count last.
__global__ void collapse_partials_kernel(const Part* partial, int64_t nq, int64_t splits,
                                         long long* mine) {
  for (int64_t q = global_thread(); q < nq; q += global_stride()) {
    Part p = identity_part();
    for (int64_t s = 0; s < splits; ++s) p = CombineParts{}(p, partial[q * splits + s]);
    mine[q] = order_key(p.mn);
    mine[nq + q] = -static_cast<long long>(order_key(p.mx));
    if (p.nonfinite) atomicAdd(reinterpret_cast<unsigned long long*>(mine + 2 * nq), p.nonfinite);
  }
}

// Every rank's contribution ([ranks][2 nq + 1], gathered) combined (MIN of keys, sum of
// counts) back into the partials: split 0 holds the global range (channel 0 the count).
__global__ void expand_partials_kernel(Part* partial, int64_t nq, int64_t splits,
                                       const long long* all, int ranks) {
  const int64_t row = 2 * nq + 1;
  for (int64_t q = global_thread(); q < nq; q += global_stride()) {
    long long lo = all[q], nhi = all[nq + q], count = all[2 * nq];
    for (int r = 1; r < ranks; ++r) {
      lo = min(lo, all[r * row + q]);
      nhi = min(nhi, all[r * row + nq + q]);
      count += all[r * row + 2 * nq];
    }
    partial[q * splits] =
        Part{key_float(static_cast<int32_t>(lo)), key_float(static_cast<int32_t>(-nhi)),
             q == 0 ? static_cast<unsigned long long>(count) : 0ull};
    for (int64_t s = 1; s < splits; ++s) partial[q * splits + s] = identity_part();
  }
}

// One all-gather per observer and step (rather than a MIN and a SUM all-reduce): the
// collective sits between the statistics and the qparams, on the critical path, so its
// latency is paid once.
void sync_partials(Communicator& comm, Tensor& partial, int64_t nq, int64_t splits,
                   const Device& device, cudaStream_t s, const std::string& op) {
  const int ranks = comm.world_size();
  Tensor mine = Tensor::empty({2 * nq + 1}, DType::i64, device);
  Tensor all = Tensor::empty({ranks * (2 * nq + 1)}, DType::i64, device);
  QG_CUDA_CHECK(op, cudaMemsetAsync(out_ptr<int64_t>(mine) + 2 * nq, 0, sizeof(int64_t), s));
  auto shape = elementwise_launch(nq);
  collapse_partials_kernel<<<shape.blocks, shape.threads, 0, s>>>(
      in_ptr<Part>(partial), nq, splits, reinterpret_cast<long long*>(mine.raw_data()));
  QG_CUDA_CHECK_LAUNCH(op);
  comm.all_gather(mine.raw_data(), all.raw_data(), static_cast<int64_t>(mine.nbytes()), s);
  expand_partials_kernel<<<shape.blocks, shape.threads, 0, s>>>(
      out_ptr<Part>(partial), nq, splits, reinterpret_cast<const long long*>(all.raw_data()),
      ranks);
  QG_CUDA_CHECK_LAUNCH(op);
}

// sync_partials through the peer mailbox, as one block: each channel's range goes out as one
// word (the min key high, the max key low), the batch's non-finite count as the word after
// the channels; every rank folds all ranks' words in rank order.
__global__ void exchange_partials_kernel(Part* partial, int64_t nq, int64_t splits, PeerMailbox m,
                                         DeviceErrorRecord* err, int32_t node) {
  __shared__ unsigned long long exchange, count;
  __shared__ bool ok;
  if (threadIdx.x == 0) {
    exchange = peer_next_exchange(m);
    count = 0;
  }
  __syncthreads();
  const unsigned long long e = exchange;
  for (int64_t q = threadIdx.x; q < nq; q += blockDim.x) {
    Part p = identity_part();
    for (int64_t s = 0; s < splits; ++s) p = CombineParts{}(p, partial[q * splits + s]);
    peer_put(m, e, q, range_word(p.mn, p.mx));
    if (p.nonfinite) atomicAdd(&count, p.nonfinite);
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    peer_put(m, e, nq, count);
    peer_raise(m, e);
    ok = peer_wait(m, e, err, node);
    peer_finish_exchange(m, e);
  }
  __syncthreads();
  for (int64_t q = threadIdx.x; q < nq; q += blockDim.x) {
    RangeFold range;
    unsigned long long total = 0;
    for (int r = 0; r < m.ranks; ++r) {
      if (!ok && r != m.rank) continue;
      range.add(peer_get(m, e, r, q));
      if (q == 0) total += peer_get(m, e, r, nq);
    }
    partial[q * splits] = Part{range.mn(), range.mx(), total};
    for (int64_t s = 1; s < splits; ++s) partial[q * splits + s] = identity_part();
  }
}

// The mailbox the observer's ranges can go through: the communicator's, when its slots hold
// the channels' words and the count.
const PeerMailbox* mailbox_for(const Communicator& comm, int64_t nq) {
  const PeerMailbox* m = comm.peer_mailbox();
  return m != nullptr && nq + 1 <= m->capacity ? m : nullptr;
}

template <bool kMovingAverage>
void observer_cuda(KernelContext& ctx) {
  const ObserverArgs& args = ctx.args<ObserverArgs>();
  const Tensor& x = ctx.inputs[0];
  const ScopeLayout& l = args.layout;
  size_t own = kMovingAverage ? 3 : 2;
  QG_CHECK(ctx.states.size() == own + 2, ctx.op, "expected ", own + 2, " state tensors, got ",
           ctx.states.size());
  auto s = cuda_stream(ctx.device);
  const int threads = 256;
  int64_t nq = l.num_qparams;
  bool update = ctx.training && x.numel() > 0;
  ObserveArgs oa = observe_args(l, in_ptr<uint8_t>(ctx.states[own + 1]), threads);
  Tensor partial;
  if (update) {
    partial = launch_observe_partials(ctx.op, x, oa, threads, s);
    if (Communicator* comm = observer_sync(ctx, l)) {
      if (const PeerMailbox* m = mailbox_for(*comm, nq)) {
        exchange_partials_kernel<<<1, 256, 0, s>>>(out_ptr<Part>(partial), nq, oa.splits, *m,
                                                   error_record(ctx.device), ctx.site);
        QG_CUDA_CHECK_LAUNCH(ctx.op);
      } else {
        sync_partials(*comm, partial, nq, oa.splits, x.device(), s, ctx.op);
      }
    }
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
    const double c = args.averaging_constant;
    QG_CHECK(c > 0 && c <= 1, ctx.op, "attribute 'averaging_constant' = ", c, " is outside (0, 1]");
    fa.c = static_cast<float>(c);
  }
  fa.cfg = args.cfg;
  fa.delayed = args.delayed;
  fa.scale = out_ptr<float>(ctx.outputs[0]);
  fa.zp = out_ptr<int32_t>(ctx.outputs[1]);
  auto shape = elementwise_launch(nq);
  observe_finish_kernel<kMovingAverage>
      <<<shape.blocks, shape.threads, 0, s>>>(update ? in_ptr<Part>(partial) : nullptr, fa);
  QG_CUDA_CHECK_LAUNCH(ctx.op);
}

}  // namespace

void add_observer_cuda_kernels(OpRegistry& r) {
  r.get_mutable("minmax_observer")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, observer_cuda<false>});
  r.get_mutable("moving_average_observer")
      .kernels.push_back({DeviceType::cuda, kFloatDTypes, observer_cuda<true>});
}

}  // namespace qg
