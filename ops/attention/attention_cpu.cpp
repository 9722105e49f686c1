// The CPU reference kernels of causal_attention and causal_attention_backward: loops per
// (batch, head, query row), the scores in M (f32 for f32/f16/bf16, f64 for f64) and a
// two-pass softmax per row (the maximum, then the exponentials), so no [T, T] matrix is
// held. attention_op.cpp states the contract and the numerics.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/attention/attention_args.h"
#include "ops/attention/attention_cpu.h"

namespace qg {
namespace {

template <typename T, typename M = math_t<T>>
M dot(const T* a, const T* b, int64_t d) {
  M s = 0;
  for (int64_t x = 0; x < d; ++x) s += static_cast<M>(a[x]) * static_cast<M>(b[x]);
  return s;
}

// Rows of q (and o, lse, do): r = (n * heads + h) * seq + i. The KV row block of r's head.
struct RowIndex {
  const AttentionLayout& l;
  int64_t query(int64_t r) const { return r % l.seq; }
  int64_t kv_block(int64_t r) const {
    const int64_t n = r / (l.heads * l.seq), h = (r / l.seq) % l.heads;
    return (n * l.kv_heads + h / l.group()) * l.seq;
  }
};

// Work per row is O(seq * head_dim); a few rows per task.
int64_t row_grain(const AttentionLayout& l) {
  return std::max<int64_t>(1, kElementGrain / (l.seq * l.head_dim));
}

template <typename T>
void forward_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const AttentionLayout& l = ctx.args<AttentionArgs>().layout;
  const T* q = ctx.inputs[0].data<T>();
  const T* k = ctx.inputs[1].data<T>();
  const T* v = ctx.inputs[2].data<T>();
  T* o = ctx.outputs[0].data<T>();
  M* lse = ctx.outputs[1].data<M>();
  const int64_t d = l.head_dim, rows = l.batch * l.heads * l.seq;
  const M scale = static_cast<M>(l.scale);
  const RowIndex idx{l};
  parallel_for(
      rows, row_grain(l),
      [&](int64_t r0, int64_t r1) {
        std::vector<M> s(static_cast<size_t>(l.seq)), acc(static_cast<size_t>(d));
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t i = idx.query(r), kv = idx.kv_block(r);
          // Causal: row i sees keys 0..i, so it always has at least one (key i itself).
          M m = -std::numeric_limits<M>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            s[j] = dot<T>(q + r * d, k + (kv + j) * d, d) * scale;
            m = std::max(m, s[j]);
          }
          M sum = 0;
          std::fill(acc.begin(), acc.end(), M(0));
          for (int64_t j = 0; j <= i; ++j) {
            const M p = std::exp(s[j] - m);
            sum += p;
            const T* vj = v + (kv + j) * d;
            for (int64_t x = 0; x < d; ++x) acc[x] += p * static_cast<M>(vj[x]);
          }
          for (int64_t x = 0; x < d; ++x) o[r * d + x] = static_cast<T>(acc[x] / sum);
          lse[r] = m + std::log(sum);
        }
      },
      rows * l.seq * d);
}

// The per-pair terms of the backward: p = exp(s - lse) and ds = p * (dp - D).
template <typename T, typename M = math_t<T>>
struct PairTerms {
  M p, ds;
};

template <typename T>
void backward_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const AttentionLayout& l = ctx.args<AttentionArgs>().layout;
  const T* q = ctx.inputs[0].data<T>();
  const T* k = ctx.inputs[1].data<T>();
  const T* v = ctx.inputs[2].data<T>();
  const T* o = ctx.inputs[3].data<T>();
  const M* lse = ctx.inputs[4].data<M>();
  const T* dout = ctx.inputs[5].data<T>();
  T* dq = ctx.outputs[0].data<T>();
  T* dk = ctx.outputs[1].data<T>();
  T* dv = ctx.outputs[2].data<T>();
  const int64_t d = l.head_dim, rows = l.batch * l.heads * l.seq;
  const M scale = static_cast<M>(l.scale);
  const RowIndex idx{l};
  // 1. D_r = do_r . o_r, the softmax backward's row term.
  std::vector<M> delta(static_cast<size_t>(rows));
  parallel_for(
      rows, std::max<int64_t>(1, kElementGrain / d),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) delta[r] = dot<T>(dout + r * d, o + r * d, d);
      },
      rows * d);
  // Query row r against key row kj (an absolute row of k and v).
  auto terms = [&](int64_t r, int64_t kj) {
    const M s = dot<T>(q + r * d, k + kj * d, d) * scale;
    const M p = std::exp(s - lse[r]);
    const M dp = dot<T>(dout + r * d, v + kj * d, d);
    // Row 0 sees only key 0: p_00 = 1 for any score, so ds_00 = 0 exactly (with the forward's
    // o, o_0 = v_0 and dp - D cancels to 0 here anyway; the GPU kernels set it explicitly).
    return PairTerms<T>{p, idx.query(r) == 0 ? M(0) : p * (dp - delta[r])};
  };
  // 2. dq_i = scale * sum over j <= i of ds_ij k_j.
  parallel_for(
      rows, row_grain(l),
      [&](int64_t r0, int64_t r1) {
        std::vector<M> acc(static_cast<size_t>(d));
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t i = idx.query(r), kv = idx.kv_block(r);
          std::fill(acc.begin(), acc.end(), M(0));
          for (int64_t j = 0; j <= i; ++j) {
            const M ds = terms(r, kv + j).ds;
            const T* kj = k + (kv + j) * d;
            for (int64_t x = 0; x < d; ++x) acc[x] += ds * static_cast<M>(kj[x]);
          }
          for (int64_t x = 0; x < d; ++x) dq[r * d + x] = static_cast<T>(acc[x] * scale);
        }
      },
      2 * rows * l.seq * d);
  // 3. dk_j = scale * sum of ds_ij q_i and dv_j = sum of p_ij do_i, over the query heads of
  //    j's KV group (in head order) and their rows i >= j (in row order).
  const int64_t kv_rows = l.batch * l.kv_heads * l.seq, group = l.group();
  parallel_for(
      kv_rows, row_grain(l),
      [&](int64_t j0, int64_t j1) {
        std::vector<M> ak(static_cast<size_t>(d)), av(static_cast<size_t>(d));
        for (int64_t kj = j0; kj < j1; ++kj) {
          const int64_t j = kj % l.seq, n = kj / (l.kv_heads * l.seq);
          const int64_t g = (kj / l.seq) % l.kv_heads;
          std::fill(ak.begin(), ak.end(), M(0));
          std::fill(av.begin(), av.end(), M(0));
          for (int64_t h = g * group; h < (g + 1) * group; ++h)
            for (int64_t i = j; i < l.seq; ++i) {
              const int64_t r = (n * l.heads + h) * l.seq + i;
              const PairTerms<T> t = terms(r, kj);
              for (int64_t x = 0; x < d; ++x) {
                ak[x] += t.ds * static_cast<M>(q[r * d + x]);
                av[x] += t.p * static_cast<M>(dout[r * d + x]);
              }
            }
          for (int64_t x = 0; x < d; ++x) {
            dk[kj * d + x] = static_cast<T>(ak[x] * scale);
            dv[kj * d + x] = static_cast<T>(av[x]);
          }
        }
      },
      2 * kv_rows * group * l.seq * d);
}

}  // namespace

void causal_attention_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                 [&](auto tag) { forward_typed<decltype(tag)>(ctx); });
}

void causal_attention_backward_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                 [&](auto tag) { backward_typed<decltype(tag)>(ctx); });
}

}  // namespace qg
