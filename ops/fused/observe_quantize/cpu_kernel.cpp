// The CPU single-loop paths for a fused observer (min/max or moving average, delayed or not)
// + quantizer (fake_quantize, or quantize to s8/u8 codes) on f32, bf16 and f16, every scope.
// The tensor is cut into pieces whose qparams are known once the piece is read: a run of
// elements sharing one qparams index, or a block of rows whose columns each have their own
// (per channel on the last axis, per group across an inner extent). Each piece is read for
// its statistics, observed, and quantized while it is still in cache; with delayed qparams
// (known before x is read) statistics and quantization share one pass in cache-sized chunks.
// Only per channel on a middle axis spreads a channel over several pieces: there all
// statistics come first, then all quantization (the math allows nothing else).
//
// Results are bit-identical to the two unfused kernels (tests/passes/fusion_test.cpp and
// fusion_cpu_paths_test.cpp check it): statistics as cpu_stats.h, the observer update
// and qparams as the observer kernels, fake-quantization through the unfused kernel's own
// SSE loops (fake_quantize_simd.h), codes as cpu_codes.h, and qparams validated as
// the quantizer kernels validate them (same error, same state left behind). f64 and empty
// inputs run the two original kernels.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/common/quant_attrs.h"
#include "ops/common/quant_scope.h"
#include "ops/fake_quantize/fake_quantize_simd.h"
#include "ops/fused/observe_quantize/cpu_codes.h"
#include "ops/fused/observe_quantize/cpu_stats.h"
#include "ops/fused/observe_quantize/observe_quantize.h"
#include "ops/observer/observer_args.h"
#include "ops/observer/observer_common.h"
#include "ops/observer/observer_math.h"

namespace qg {
namespace {

using fused_cpu::Ranges;

// The observer's state tensors (the fused node's first states) and its update rules.
struct Observer {
  bool moving_average = false, delayed = false, update = false;
  float c = 0.0f;
  float *mn = nullptr, *mx = nullptr;
  uint8_t* init = nullptr;
  int64_t* nonfinite = nullptr;
  qmath::QParamsConfig cfg;

  qmath::QParams qparams(int64_t q) const {
    bool valid = moving_average ? init[q] != 0 : mn[q] <= mx[q];
    return qmath::qparams_from_range(mn[q], mx[q], valid, cfg);
  }
  // Folds this batch's range of channel q (+inf/-inf when it had no finite value) in.
  void fold(int64_t q, float bmn, float bmx) {
    if (!moving_average) {
      mn[q] = obsmath::ordered_min(mn[q], bmn);
      mx[q] = obsmath::ordered_max(mx[q], bmx);
    } else if (bmn <= bmx) {
      mn[q] = init[q] ? obsmath::moving_average(mn[q], bmn, c) : bmn;
      mx[q] = init[q] ? obsmath::moving_average(mx[q], bmx, c) : bmx;
      init[q] = 1;
    }
  }
};

// `rows` contiguous rows of `width` elements from flat index k0. lanes: element j of a row
// uses qparams q0 + j; otherwise every element uses q0 (and rows is 1).
struct Piece {
  int64_t k0, rows, width, q0;
  bool lanes;
  int64_t num_qparams() const { return lanes ? width : 1; }
};

// The pieces of a scope, in increasing qparams order.
template <typename Fn>
void for_each_piece(const ScopeLayout& l, int64_t numel, Fn&& fn) {
  const int64_t row = l.axis_len * l.inner;
  switch (l.kind) {
    case ScopeKind::tensor:
      fn(Piece{0, 1, numel, 0, false});
      return;
    case ScopeKind::token:
      for (int64_t o = 0; o < l.outer; ++o) fn(Piece{o * row, 1, row, o, false});
      return;
    case ScopeKind::channel:
      if (l.inner == 1) {
        fn(Piece{0, l.outer, l.axis_len, 0, true});
      } else {
        for (int64_t o = 0; o < l.outer; ++o)
          for (int64_t a = 0; a < l.axis_len; ++a)
            fn(Piece{o * row + a * l.inner, 1, l.inner, a, false});
      }
      return;
    case ScopeKind::group:
      for (int64_t o = 0; o < l.outer; ++o)
        for (int64_t g = 0; g < l.num_groups; ++g) {
          const int64_t a = g * l.group_size, len = std::min(l.group_size, l.axis_len - a);
          const int64_t q = o * l.num_groups + g;
          if (l.inner == 1)
            fn(Piece{o * row + a, 1, len, q, false});
          else
            fn(Piece{o * row + a * l.inner, len, l.inner, q * l.inner, true});
        }
      return;
  }
}

// A piece cut into chunks of about kChunk elements (whole rows for lanes): small enough to
// stay in L2 between the statistics and the quantization reading them.
constexpr int64_t kChunk = 16384;
template <typename Fn>
void for_each_chunk(const Piece& p, Fn&& fn) {
  if (!p.lanes) {
    for (int64_t s = 0; s < p.width; s += kChunk)
      fn(Piece{p.k0 + s, 1, std::min(kChunk, p.width - s), p.q0, false});
    return;
  }
  const int64_t step = std::max<int64_t>(1, kChunk / std::max<int64_t>(p.width, 1));
  for (int64_t r = 0; r < p.rows; r += step)
    fn(Piece{p.k0 + r * p.width, std::min(step, p.rows - r), p.width, p.q0, true});
}

enum class Output { fake, codes_s8, codes_u8, passthrough };

template <typename T>
struct Pass {
  const T* x;
  void* y;
  uint8_t* mask;
  Output out;
  float qmin, qmax;
  std::vector<float> inv, scale, zp;  // per qparams index, f32 as the quantizer loads them

  void stats(const Piece& p, Ranges& r) const {
    if (p.lanes)
      fused_cpu::lane_stats(x + p.k0, p.rows, p.width, p.q0, r);
    else
      fused_cpu::run_stats(x + p.k0, p.width, p.q0, r);
  }

  void quantize(const Piece& p) const {
    if (out == Output::passthrough) return;  // written once at the end
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t k = p.k0 + r * p.width, q = p.q0;
      if (p.lanes) {
        fq_simd::LaneQParams lp{inv.data() + q, scale.data() + q, zp.data() + q, qmin, qmax};
        if (out == Output::fake)
          fq_simd::fake_quant_lanes(x + k, static_cast<T*>(y) + k, mask, k, p.width, lp);
        else if (out == Output::codes_s8)
          fused_cpu::code_lanes(x + k, static_cast<int8_t*>(y) + k, mask, k, p.width, lp);
        else
          fused_cpu::code_lanes(x + k, static_cast<uint8_t*>(y) + k, mask, k, p.width, lp);
      } else {
        fq_simd::RunQParams rp{inv[q], scale[q], zp[q], qmin, qmax};
        if (out == Output::fake)
          fq_simd::fake_quant_run(x + k, static_cast<T*>(y) + k, mask, k, p.width, rp);
        else if (out == Output::codes_s8)
          fused_cpu::code_run(x + k, static_cast<int8_t*>(y) + k, mask, k, p.width, rp);
        else
          fused_cpu::code_run(x + k, static_cast<uint8_t*>(y) + k, mask, k, p.width, rp);
      }
    }
  }
};

// Consecutive pieces (or chunks) grouped into tasks of the thread pool: a task closes once
// it holds kChunk elements, and the next one starts only at an element index that is a
// multiple of 8, so no two tasks write one mask byte. The cut depends on the layout alone.
struct TaskList {
  std::vector<Piece> pieces;
  std::vector<size_t> starts;  // task t is pieces [starts[t], starts[t + 1])
  int64_t open = 0;            // elements in the last task so far
  int64_t total = 0;           // elements in all tasks

  void add(const Piece& p) {
    if (starts.empty() || (open >= kChunk && p.k0 % 8 == 0)) {
      starts.push_back(pieces.size());
      open = 0;
    }
    pieces.push_back(p);
    open += p.rows * p.width;
    total += p.rows * p.width;
  }
  int64_t size() const { return static_cast<int64_t>(starts.size()); }
  // fn(first, last): the pieces of one task, on the pool.
  template <typename Fn>
  void run(const Fn& fn) const {
    parallel_chunks(
        size(),
        [&](int64_t t) {
          const size_t e = t + 1 < size() ? starts[t + 1] : pieces.size();
          fn(pieces.data() + starts[t], pieces.data() + e);
        },
        total);
  }
};

TaskList make_tasks(const ScopeLayout& l, int64_t numel, bool chunked) {
  TaskList t;
  for_each_piece(l, numel, [&](const Piece& p) {
    if (chunked)
      for_each_chunk(p, [&](const Piece& c) { t.add(c); });
    else
      t.add(p);
  });
  return t;
}

// The qparams indices [lo, hi) that the pieces [first, last) touch.
struct QSpan {
  int64_t lo, hi;
};
QSpan qspan(const Piece* first, const Piece* last) {
  QSpan s{first->q0, first->q0 + first->num_qparams()};
  for (const Piece* p = first; p != last; ++p) {
    s.lo = std::min(s.lo, p->q0);
    s.hi = std::max(s.hi, p->q0 + p->num_qparams());
  }
  return s;
}

// fake_quant_enabled == 0: y = x, every mask bit of an element set (fake_quantize_disabled).
void write_passthrough(const Tensor& x, Tensor& y, Tensor& mask) {
  const auto* src = static_cast<const char*>(x.raw_data());
  auto* dst = static_cast<char*>(y.raw_data());
  const int64_t size = dtype_size(x.dtype());
  uint8_t* m = mask.data<uint8_t>();
  parallel_for(x.numel(), kElementGrain, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b * size, src + b * size, static_cast<size_t>((e - b) * size));
    std::memset(m + b / 8, 0xff, static_cast<size_t>((e - b) / 8));
    if (int tail = static_cast<int>((e - b) & 7))  // only the last chunk has a tail
      m[e / 8] = static_cast<uint8_t>((1u << tail) - 1);
  });
}

constexpr int64_t kNoBadQParams = std::numeric_limits<int64_t>::max();

// Three schedules, each a deterministic cut of the tensor into tasks:
//  * qparams known before x is read (delayed, or no update): one parallel pass, statistics
//    and quantization chunk by chunk;
//  * every piece its own qparams (token, group, channel of a single outer row): one parallel
//    pass, each piece read for its statistics, observed and quantized while in cache;
//  * otherwise (per tensor; channel on the last axis, or a middle axis with several outer
//    rows: pieces share qparams): parallel statistics, the observer on this thread, then
//    parallel quantization.
// Batch ranges are integer keys combined by min/max (order-free) into the shared ranges,
// so the statistics do not depend on which thread read which chunk.
template <typename T>
void run_fast_path(KernelContext& ctx, Observer& o, Output out, const QuantRange& range,
                   const ScopeLayout& l) {
  const Tensor& x = ctx.inputs[0];
  const std::string& qop = ctx.part(1).op->name;  // names it in qparam errors
  const int64_t nq = l.num_qparams;
  Pass<T> pass{x.data<T>(),
               ctx.outputs[0].raw_data(),
               ctx.outputs[1].data<uint8_t>(),
               out,
               static_cast<float>(range.qmin),
               static_cast<float>(range.qmax),
               std::vector<float>(nq),
               std::vector<float>(nq),
               std::vector<float>(nq)};
  float* scale = ctx.outputs[2].data<float>();
  int32_t* zp = ctx.outputs[3].data<int32_t>();
  parallel_for(ctx.outputs[1].numel(), kElementGrain, [&](int64_t b, int64_t e) {
    std::memset(pass.mask + b, 0, static_cast<size_t>(e - b));
  });
  Ranges ranges(o.update ? nq : 0);
  // The first qparams index the quantizer would reject: from there on nothing is quantized,
  // the observer still runs, and the quantizer's own check throws at the end.
  std::atomic<int64_t> bad{kNoBadQParams};
  auto set_qparams = [&](int64_t q) {
    qmath::QParams p = o.qparams(q);
    scale[q] = p.scale;
    zp[q] = p.zero_point;
    pass.scale[q] = p.scale;
    pass.inv[q] = 1.0f / p.scale;
    pass.zp[q] = static_cast<float>(p.zero_point);
    bool ok = std::isfinite(p.scale) && p.scale > 0.0f && p.zero_point >= range.qmin &&
              p.zero_point <= range.qmax;
    if (!ok && out != Output::passthrough) {
      int64_t cur = bad.load();
      while (q < cur && !bad.compare_exchange_weak(cur, q)) {
      }
    }
  };
  auto quantize = [&](const Piece& p) {
    if (bad.load(std::memory_order_relaxed) == kNoBadQParams) pass.quantize(p);
  };
  // Statistics of pieces [first, last) into a task's own ranges, then into the shared ones.
  auto task_stats = [&](const Piece* first, const Piece* last) {
    const QSpan span = qspan(first, last);
    Ranges local(span.hi - span.lo);
    for (const Piece* p = first; p != last; ++p)
      pass.stats(Piece{p->k0, p->rows, p->width, p->q0 - span.lo, p->lanes}, local);
    fused_cpu::merge_ranges(local, span.lo, ranges);
  };

  // Data parallelism: the batch ranges become the global batch's (observer_common.h) between
  // the statistics and the fold. Pieces with their own qparams then cannot be quantized
  // while still in cache (their range needs the other ranks'), so they take the schedule
  // of shared qparams: all statistics, one all-reduce, all quantization.
  Communicator* comm =
      o.update ? observer_sync(ctx, l, ctx.part(0).args<ObserverArgs>().replicated) : nullptr;
  auto sync = [&] {
    if (comm == nullptr) return;
    ranges.nonfinite = all_reduce_range_keys_and_count(*comm, ranges.lo.data(), ranges.hi.data(),
                                                       nq, ranges.nonfinite);
  };
  const bool own_qparams =
      comm == nullptr && (l.kind == ScopeKind::token || l.kind == ScopeKind::group ||
                          (l.kind == ScopeKind::channel && l.inner > 1 && l.outer == 1));
  if (o.delayed || !o.update) {
    for (int64_t q = 0; q < nq; ++q) set_qparams(q);
    make_tasks(l, x.numel(), true).run([&](const Piece* first, const Piece* last) {
      if (o.update) task_stats(first, last);
      for (const Piece* p = first; p != last; ++p) quantize(*p);
    });
    sync();  // delayed: the previous step's qparams quantized; this step's ranges sync after
    if (o.update)
      for (int64_t q = 0; q < nq; ++q) o.fold(q, ranges.min(q), ranges.max(q));
  } else if (own_qparams) {
    make_tasks(l, x.numel(), false).run([&](const Piece* first, const Piece* last) {
      int64_t nonfinite = 0;
      for (const Piece* p = first; p != last; ++p) {
        Ranges local(p->num_qparams());
        pass.stats(Piece{p->k0, p->rows, p->width, 0, p->lanes}, local);
        nonfinite += local.nonfinite;
        for (int64_t j = 0; j < p->num_qparams(); ++j) {
          o.fold(p->q0 + j, local.min(j), local.max(j));
          set_qparams(p->q0 + j);
        }
        quantize(*p);
      }
      __atomic_fetch_add(&ranges.nonfinite, nonfinite, __ATOMIC_RELAXED);
    });
  } else {
    const TaskList tasks = make_tasks(l, x.numel(), true);
    tasks.run(task_stats);
    sync();
    for (int64_t q = 0; q < nq; ++q) {
      o.fold(q, ranges.min(q), ranges.max(q));
      set_qparams(q);
    }
    tasks.run([&](const Piece* first, const Piece* last) {
      for (const Piece* p = first; p != last; ++p) quantize(*p);
    });
  }
  if (o.update) *o.nonfinite += ranges.nonfinite;
  if (const int64_t q = bad.load(); q != kNoBadQParams) {
    check_scale_value(qop, scale[q], q);
    check_zero_point_value(qop, zp[q], range, q);
  }
  if (out == Output::passthrough) write_passthrough(x, ctx.outputs[0], ctx.outputs[1]);
}

bool try_fast_path(KernelContext& ctx) {
  const ObserveQuantizeArgs& p = ctx.args<ObserveQuantizeArgs>();
  const Tensor& x = ctx.inputs[0];
  const DType dt = x.dtype();
  if (x.numel() == 0 || (dt != DType::f32 && dt != DType::bf16 && dt != DType::f16)) return false;
  const ScopeLayout& l = p.layout;
  // Keeps the 32-bit lane counters of fused_cpu_stats exact.
  if (l.kind != ScopeKind::tensor && x.numel() >= (int64_t{1} << 30)) return false;
  size_t s = 0;
  Observer o;
  o.moving_average = p.moving_average;
  o.delayed = p.delayed;
  o.mn = ctx.states.at(s++).data<float>();
  o.mx = ctx.states.at(s++).data<float>();
  o.init = o.moving_average ? ctx.states.at(s++).data<uint8_t>() : nullptr;
  o.nonfinite = ctx.states.at(s++).data<int64_t>();
  const bool enabled = ctx.states.at(s++).data<uint8_t>()[0] != 0;
  o.update = ctx.training && enabled;
  o.c = p.averaging_constant;
  o.cfg = p.cfg;
  const QuantRange& range = p.range;
  Output out = Output::fake;
  if (p.codes) {
    DType qd = ctx.outputs[0].dtype();
    if (qd != DType::i8 && qd != DType::u8) return false;
    out = qd == DType::i8 ? Output::codes_s8 : Output::codes_u8;
  } else if (s < ctx.states.size() && ctx.states[s].data<uint8_t>()[0] == 0) {
    out = Output::passthrough;  // fake_quant_enabled off
  }
  if (dt == DType::f32)
    run_fast_path<float>(ctx, o, out, range, l);
  else if (dt == DType::bf16)
    run_fast_path<bf16>(ctx, o, out, range, l);
  else
    run_fast_path<f16>(ctx, o, out, range, l);
  return true;
}

}  // namespace

void fused_observe_quantize_cpu(KernelContext& ctx) {
  apply_prologue(ctx, DeviceType::cpu);
  if (!try_fast_path(ctx)) run_fused_observe_quantize_composed(ctx, DeviceType::cpu);
}

}  // namespace qg
