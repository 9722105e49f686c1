// causal_attention: softmax(q k^T * scale + causal mask) v as one op, flash-style (no [T, T]
// matrix is held), with grouped-query heads; and its backward op.
//   causal_attention           {q [N, H, T, hd], k [N, KV, T, hd], v [N, KV, T, hd]}
//                              -> {o [N, H, T, hd], lse [N, H, T]}
//   causal_attention_backward  {q, k, v, o, lse, do} -> {dq, dk, dv}
// Query head h reads KV head h / (H / KV) (transformers' repeat_kv order); dk and dv sum
// over the H / KV query heads of each KV head. Row i attends to keys j <= i, so every row
// sees at least its own key: a fully masked row cannot occur, and T = 1 is one key per row.
// scale defaults to hd^-1/2.
//
// Numerics. The scores, the softmax statistics and every accumulation are in M: f32 for
// f32, f16 and bf16 inputs (their elements widened exactly), f64 for f64 (the gradient-check
// reference). Per query row i: s_j = M(q_i . k_j) * scale for j <= i, m = max_j s_j,
// l = sum_j exp(s_j - m), o_i = T(sum_j exp(s_j - m) v_j / l) (rounded once to the input
// dtype), lse_i = m + log(l) (kept in M, f32 or f64). The backward recomputes
// p_ij = exp(s_ij - lse_i), D_i = do_i . o_i, ds_ij = p_ij (do_i . v_j - D_i), except
// ds_00 = 0 exactly (row 0 sees one key, so its softmax is constant; computed, it cancels
// only to rounding, and at T = 1 that rounding would be the whole of dq and dk), and returns
// dq = T(scale * sum_j ds_ij k_j), dk = T(scale * sum ds_ij q_i), dv = T(sum p_ij do_i),
// each rounded once. The kernels sum in different orders (the CPU per row in key order, the
// GPU per tile with the online-softmax rescaling), so the backends agree to rounding, not bit
// for bit. On CUDA, bf16 and f16 run on tensor cores (mma m16n8k16, f32 accumulation): the
// products q k^T, do v^T are exact in f32, while P (for P v, P^T do) and dS (for dS k,
// dS^T q) are rounded to the input dtype as the A operand, as flash attention does: one more
// rounding of the dtype per term, errors of random sign that stay near one ulp of the result
// (tests/ops_attention's GPU test holds them to the crosscheck's two ulps).
// f32 and f64 run SIMT kernels in M. Where the build has cuDNN and its frontend, bf16 and f16
// at head dims 64 and 128 run on cuDNN's fused SDPA instead, to the same rounding rule
// (attention_cudnn.h; QG_ATTENTION_BACKEND in attention_backend.h chooses). Against the composed
// graph (batched_matmul, scale, mask, softmax, batched_matmul) the f32 result agrees to f32
// rounding; in f16/bf16 the composed graph rounds the scores and probabilities to the dtype, which
// this op does not, so the fused op is the closer one to the f32 result.
//
// Inputs may be strided views (any non-negative strides on the batch, head and seq axes,
// stride 1 on head_dim; attention_strides.h); outputs are contiguous.
//
// lse is an output for the backward only: it has no gradient of its own (a loss that reads
// lse is refused when its gradient is built).
#include <cmath>
#include <vector>

#include "core/graph.h"
#include "core/half.h"
#include "ops/attention/attention_args.h"
#include "ops/attention/attention_cpu.h"
#include "ops/common/schema_helpers.h"

namespace qg {
namespace {

DType stats_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

AttrSpec scale_attr() {
  AttrSpec s = real_attr("scale", std::nullopt, "multiplies q . k; unset: head_dim^-1/2");
  s.optional = true;
  s.validate = [](const std::string& op, const Attr& v) {
    const double x = v.as_real();
    QG_CHECK(std::isfinite(x) && x > 0, op, "attribute 'scale' = ", x, " must be finite and > 0");
  };
  return s;
}

// q [N, H, T, hd], k and v [N, KV, T, hd] of one float dtype, H a multiple of KV, no empty
// axis.
void check_qkv(const InferContext& ctx) {
  expect_float(ctx, 0);
  expect_same_dtype(ctx, 0, 1);
  expect_same_dtype(ctx, 0, 2);
  const TensorType &q = ctx.inputs[0], &k = ctx.inputs[1], &v = ctx.inputs[2];
  QG_CHECK(q.shape.size() == 4, ctx.op, "q must be [batch, heads, seq, head_dim], got ", q.str());
  QG_CHECK(k.shape.size() == 4, ctx.op, "k must be [batch, kv_heads, seq, head_dim], got ",
           k.str());
  QG_CHECK(k.shape == v.shape, ctx.op, "k ", k.str(), " and v ", v.str(),
           " must have the same shape");
  QG_CHECK(k.shape[0] == q.shape[0] && k.shape[2] == q.shape[2] && k.shape[3] == q.shape[3], ctx.op,
           "k and v must be [", q.shape[0], ", kv_heads, ", q.shape[2], ", ", q.shape[3],
           "] (q's batch, seq and head_dim) for q ", q.str(), ", got ", k.str());
  for (int64_t e : q.shape)
    QG_CHECK(e > 0, ctx.op, "q ", q.str(), " has an empty axis (seq must be at least 1)");
  QG_CHECK(k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0, ctx.op, "the ", q.shape[1],
           " query heads of q ", q.str(), " must be a multiple of the ", k.shape[1],
           " KV heads of k ", k.str());
}

TensorType lse_type(const TensorType& q) {
  return {stats_dtype(q.dtype), Shape(q.shape.begin(), q.shape.end() - 1)};
}

std::shared_ptr<const KernelArgs> parse_args(const ArgsSource& s) {
  auto a = std::make_shared<AttentionArgs>();
  const TensorType &q = s.inputs.at(0), &k = s.inputs.at(1);
  AttentionLayout& l = a->layout;
  l.batch = q.shape.at(0);
  l.heads = q.shape.at(1);
  l.seq = q.shape.at(2);
  l.head_dim = q.shape.at(3);
  l.kv_heads = k.shape.at(1);
  l.scale = s.attrs.has("scale") ? s.attrs.get_real("scale")
                                 : 1.0 / std::sqrt(static_cast<double>(l.head_dim));
  return a;
}

Attrs scale_of(const Node& n) {
  Attrs a;
  if (n.attrs.has("scale")) a.set("scale", n.attrs.get_real("scale"));
  return a;
}

GradcheckSample sample(const std::string& label, int64_t n, int64_t h, int64_t kv, int64_t t,
                       int64_t hd, Attrs attrs = {}) {
  return GradcheckSample(label,
                         {GradcheckInput{{n, h, t, hd}}, GradcheckInput{{n, kv, t, hd}},
                          GradcheckInput{{n, kv, t, hd}}},
                         std::move(attrs));
}

void define_forward(OpRegistry& r) {
  OpDef& op = r.define("causal_attention");
  op.doc =
      "softmax(q k^T * scale + causal mask) v with grouped-query heads, flash-style (no T x T "
      "matrix); the statistics in f32 (f64 for f64); also returns the row log-sum-exp.";
  op.inputs = {"q", "k", "v"};
  op.outputs = {"o", "lse"};
  op.attrs = {scale_attr()};
  op.parse_args = parse_args;
  op.differentiable_inputs = {true, true, true};
  op.infer = [](const InferContext& ctx) {
    check_qkv(ctx);
    return std::vector<TensorType>{ctx.inputs[0], lse_type(ctx.inputs[0])};
  };
  // Read q, k and v through their strides (attention_strides.h): a direct call may pass slices
  // of a fused QKV projection or permuted views without a copy.
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, causal_attention_cpu, /*strided=*/true});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    QG_CHECK(c.output_grads.size() < 2 || c.output_grads[1] == kNoValue, n.op->name, "node '",
             n.name,
             "': its lse output has no gradient (it is saved for the "
             "backward only); compute the loss from o");
    return c.graph.apply(
        "causal_attention_backward",
        {n.inputs[0], n.inputs[1], n.inputs[2], n.outputs[0], n.outputs[1], c.grad_or_zeros(0)},
        scale_of(n));
  };
  // Head dims 64 and 128: the tiled CUDA kernels' sizes (`qat crosscheck` runs these too).
  op.gradcheck_samples = [] {
    return std::vector<GradcheckSample>{
        sample("[1,2,3,64] kv 2", 1, 2, 2, 3, 64),
        sample("GQA [2,4,2,64] kv 2", 2, 4, 2, 2, 64),
        sample("MQA T=1 [1,2,1,128] kv 1", 1, 2, 1, 1, 128),
        sample("[1,3,4,64] kv 1 scale 0.3", 1, 3, 1, 4, 64, {{"scale", 0.3}}),
    };
  };
}

void define_backward(OpRegistry& r) {
  OpDef& back = r.define("causal_attention_backward");
  back.doc =
      "dq, dk and dv of causal_attention from q, k, v, o, the saved lse and do (dk, dv summed "
      "over each KV head's query heads).";
  back.inputs = {"q", "k", "v", "o", "lse", "do"};
  back.outputs = {"dq", "dk", "dv"};
  back.attrs = {scale_attr()};
  back.parse_args = parse_args;
  back.infer = [](const InferContext& ctx) {
    check_qkv(ctx);
    const TensorType &q = ctx.inputs[0], &o = ctx.inputs[3], &dout = ctx.inputs[5];
    QG_CHECK(o == q, ctx.op, "o ", o.str(), " must match q ", q.str());
    QG_CHECK(dout == q, ctx.op, "do ", dout.str(), " must match q ", q.str());
    const TensorType lse = lse_type(q);
    QG_CHECK(ctx.inputs[4] == lse, ctx.op, "lse must be ", lse.str(), " (one per row of q ",
             q.str(), "), got ", ctx.inputs[4].str());
    return std::vector<TensorType>{q, ctx.inputs[1], ctx.inputs[2]};
  };
  back.kernels.push_back(
      {DeviceType::cpu, kFloatDTypes, causal_attention_backward_cpu, /*strided=*/true});
}

}  // namespace

void add_attention_cuda_kernels(OpRegistry& r);  // attention_cuda.cu
void add_attention_crosscheck(OpRegistry& r);    // attention_crosscheck.cpp

void define_attention_ops(OpRegistry& r) {
  define_forward(r);
  define_backward(r);
#ifdef QG_WITH_CUDA
  add_attention_cuda_kernels(r);
#endif
  add_attention_crosscheck(r);
}

}  // namespace qg
