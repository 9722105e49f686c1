// The CPU reference kernels of causal_attention and causal_attention_backward: loops per
// (batch, head, query row), the scores in M (f32 for f32/f16/bf16, f64 for f64) and a
// two-pass softmax per row (the maximum, then the exponentials), so no [T, T] matrix is
// held. The inputs may be strided views (attention_strides.h); the outputs are contiguous.
// attention_op.cpp states the contract and the numerics.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/attention/attention_args.h"
#include "ops/attention/attention_cpu.h"
#include "ops/attention/attention_strides.h"

namespace qg {
namespace {

template <typename T, typename M = math_t<T>>
M dot(const T* a, const T* b, int64_t d) {
  M s = 0;
  for (int64_t x = 0; x < d; ++x) s += static_cast<M>(a[x]) * static_cast<M>(b[x]);
  return s;
}

// Rows of the outputs o, lse and dq (contiguous): r = (n * heads + h) * seq + i. The inputs'
// rows are found through their strides (attention_strides.h) from (n, h, i).
struct RowIndex {
  const AttentionLayout& l;
  struct Row {
    int64_t n, h, i;
  };
  Row of(int64_t r) const { return {r / (l.heads * l.seq), (r / l.seq) % l.heads, r % l.seq}; }
  int64_t kv_head(int64_t h) const { return h / l.group(); }
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
  const AttentionStrides st = attention_strides(ctx);
  parallel_for(
      rows, row_grain(l),
      [&](int64_t r0, int64_t r1) {
        std::vector<M> s(static_cast<size_t>(l.seq)), acc(static_cast<size_t>(d));
        for (int64_t r = r0; r < r1; ++r) {
          const RowIndex::Row at = idx.of(r);
          const int64_t i = at.i, g = idx.kv_head(at.h);
          const T* qr = q + st.q.at(at.n, at.h, i);
          const T* kb = k + st.k.at(at.n, g, 0);
          const T* vb = v + st.v.at(at.n, g, 0);
          // Causal: row i sees keys 0..i, so it always has at least one (key i itself).
          M m = -std::numeric_limits<M>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            s[j] = dot<T>(qr, kb + j * st.k.seq, d) * scale;
            m = std::max(m, s[j]);
          }
          M sum = 0;
          std::fill(acc.begin(), acc.end(), M(0));
          for (int64_t j = 0; j <= i; ++j) {
            const M p = std::exp(s[j] - m);
            sum += p;
            const T* vj = vb + j * st.v.seq;
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
  const AttentionStrides st = attention_strides(ctx);
  // 1. D_r = do_r . o_r, the softmax backward's row term.
  std::vector<M> delta(static_cast<size_t>(rows));
  parallel_for(
      rows, std::max<int64_t>(1, kElementGrain / d),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const RowIndex::Row at = idx.of(r);
          delta[r] = dot<T>(dout + st.dout.at(at.n, at.h, at.i), o + st.o.at(at.n, at.h, at.i), d);
        }
      },
      rows * d);
  // What the pair terms read of query row r = (n, h, i).
  struct QueryRow {
    const T* q;
    const T* dout;
    M lse, delta;
    int64_t i;
  };
  auto query_row = [&](int64_t n, int64_t h, int64_t i, int64_t r) {
    return QueryRow{q + st.q.at(n, h, i), dout + st.dout.at(n, h, i), lse[st.lse.at(n, h, i)],
                    delta[r], i};
  };
  // Query row `row` against key row kj and value row vj.
  auto terms = [&](const QueryRow& row, const T* kj, const T* vj) {
    const M s = dot<T>(row.q, kj, d) * scale;
    const M p = std::exp(s - row.lse);
    const M dp = dot<T>(row.dout, vj, d);
    // Row 0 sees only key 0: p_00 = 1 for any score, so ds_00 = 0 exactly (with the forward's
    // o, o_0 = v_0 and dp - D cancels to 0 here anyway; the GPU kernels set it explicitly).
    return PairTerms<T>{p, row.i == 0 ? M(0) : p * (dp - row.delta)};
  };
  // 2. dq_i = scale * sum over j <= i of ds_ij k_j.
  parallel_for(
      rows, row_grain(l),
      [&](int64_t r0, int64_t r1) {
        std::vector<M> acc(static_cast<size_t>(d));
        for (int64_t r = r0; r < r1; ++r) {
          const RowIndex::Row at = idx.of(r);
          const int64_t i = at.i, g = idx.kv_head(at.h);
          const QueryRow row = query_row(at.n, at.h, i, r);
          const T* kb = k + st.k.at(at.n, g, 0);
          const T* vb = v + st.v.at(at.n, g, 0);
          std::fill(acc.begin(), acc.end(), M(0));
          for (int64_t j = 0; j <= i; ++j) {
            const T* kj = kb + j * st.k.seq;
            const M ds = terms(row, kj, vb + j * st.v.seq).ds;
            for (int64_t x = 0; x < d; ++x) acc[x] += ds * static_cast<M>(kj[x]);
          }
          for (int64_t x = 0; x < d; ++x) dq[r * d + x] = static_cast<T>(acc[x] * scale);
        }
      },
      2 * rows * l.seq * d);
  // 3. dk_j = scale * sum of ds_ij q_i and dv_j = sum of p_ij do_i, over the query heads of
  //    j's KV group (in head order) and their rows i >= j (in row order). kj is the row of
  //    dk and dv: (n * kv_heads + g) * seq + j.
  const int64_t kv_rows = l.batch * l.kv_heads * l.seq, group = l.group();
  parallel_for(
      kv_rows, row_grain(l),
      [&](int64_t j0, int64_t j1) {
        std::vector<M> ak(static_cast<size_t>(d)), av(static_cast<size_t>(d));
        for (int64_t kj = j0; kj < j1; ++kj) {
          const int64_t j = kj % l.seq, n = kj / (l.kv_heads * l.seq);
          const int64_t g = (kj / l.seq) % l.kv_heads;
          const T* krow = k + st.k.at(n, g, j);
          const T* vrow = v + st.v.at(n, g, j);
          std::fill(ak.begin(), ak.end(), M(0));
          std::fill(av.begin(), av.end(), M(0));
          for (int64_t h = g * group; h < (g + 1) * group; ++h)
            for (int64_t i = j; i < l.seq; ++i) {
              const QueryRow row = query_row(n, h, i, (n * l.heads + h) * l.seq + i);
              const PairTerms<T> t = terms(row, krow, vrow);
              for (int64_t x = 0; x < d; ++x) {
                ak[x] += t.ds * static_cast<M>(row.q[x]);
                av[x] += t.p * static_cast<M>(row.dout[x]);
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
