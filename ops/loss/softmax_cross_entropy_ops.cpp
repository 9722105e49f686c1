// softmax_cross_entropy(logits [N, C], labels [N]) -> mean (or sum) of
// logsumexp(logits_i) - logits_i[label_i], in f32 for 16-bit logits (loss_args.h). The backward is
// its own op, (softmax - onehot) * dloss / N, since composing it from primitives would need a
// log-sum-exp and a one-hot op for no benefit.
#include <cmath>

#include "core/graph.h"
#include "core/half.h"
#include "ops/common/schema_helpers.h"
#include "ops/loss/loss_args.h"

namespace qg {
namespace {

void check_inputs(const InferContext& ctx) {
  expect_float(ctx, 0);
  expect_rank(ctx, 0, 2);
  expect_integral(ctx, 1);
  expect_rank(ctx, 1, 1);
  QG_CHECK(ctx.inputs[0].shape[0] == ctx.inputs[1].shape[0], ctx.op, "logits ", ctx.inputs[0].str(),
           " and labels ", ctx.inputs[1].str(), " disagree on the batch size");
}

int64_t label_at(const Tensor& labels, int64_t i, int64_t classes, const std::string& op) {
  int64_t y = static_cast<int64_t>(labels.at(i));
  QG_CHECK(y >= 0 && y < classes, op, "labels[", i, "] = ", y, " is outside [0, ", classes, ")");
  return y;
}

// Calls row_fn(i, row_max, log_sum_exp) for each row, in double.
template <typename T, typename Fn>
void for_each_row(const Tensor& logits, Fn&& row_fn) {
  const T* p = logits.data<T>();
  int64_t n = logits.size(0), c = logits.size(1);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, static_cast<double>(p[i * c + j]));
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += std::exp(static_cast<double>(p[i * c + j]) - mx);
    row_fn(i, p + i * c, mx + std::log(s));
  }
}

}  // namespace

void add_loss_cuda_kernels(OpRegistry& r);  // loss_cuda.cu
void add_loss_crosscheck(OpRegistry& r);    // loss_crosscheck.cpp

void define_loss_ops(OpRegistry& r) {
  OpDef& op = r.define("softmax_cross_entropy");
  op.doc = "Softmax cross-entropy of logits [N, C] against integer labels [N].";
  op.inputs = {"logits", "labels"};
  op.outputs = {"loss"};
  op.attrs = {string_attr("reduction", "mean", {"mean", "sum"}, "how rows combine")};
  op.differentiable_inputs = {true, false};
  op.infer = [](const InferContext& ctx) {
    check_inputs(ctx);
    return std::vector<TensorType>{{cross_entropy_loss_dtype(ctx.inputs[0].dtype), {}}};
  };
  op.parse_args = parse_cross_entropy_args;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          const Tensor& logits = ctx.inputs[0];
                          const bool mean = ctx.args<CrossEntropyArgs>().mean;
                          dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
                            using T = decltype(tag);
                            double total = 0;
                            int64_t c = logits.size(1);
                            for_each_row<T>(logits, [&](int64_t i, const T* row, double lse) {
                              total += lse - static_cast<double>(
                                                 row[label_at(ctx.inputs[1], i, c, ctx.op)]);
                            });
                            if (mean) total /= static_cast<double>(logits.size(0));
                            using L = cross_entropy_loss_t<T>;
                            ctx.outputs[0].data<L>()[0] = static_cast<L>(total);
                          });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("softmax_cross_entropy_backward",
                           {c.node.inputs[0], c.node.inputs[1], c.grad_or_zeros(0)}, c.node.attrs),
            kNoValue};
  };
  op.gradcheck_samples = [] {
    GradcheckSample s{"[4,5]", {{{4, 5}, DType::f64, -2, 2}, {{4}, DType::i64}}, {}};
    s.inputs[1].values = {0, 3, 4, 1};
    GradcheckSample sum = s;
    sum.label = "[4,5] sum";
    sum.attrs = {{"reduction", "sum"}};
    return std::vector<GradcheckSample>{s, sum};
  };

  OpDef& back = r.define("softmax_cross_entropy_backward");
  back.doc = "dlogits = (softmax(logits) - onehot(labels)) * dloss (/ N for mean).";
  back.inputs = {"logits", "labels", "dloss"};
  back.outputs = {"dlogits"};
  back.attrs = {string_attr("reduction", "mean", {"mean", "sum"}, "as in the forward op")};
  back.infer = [](const InferContext& ctx) {
    check_inputs(ctx);
    const DType loss = cross_entropy_loss_dtype(ctx.inputs[0].dtype);
    QG_CHECK(ctx.inputs[2].numel() == 1 && ctx.inputs[2].dtype == loss, ctx.op,
             "dloss must be a scalar of the loss's dtype ", dtype_name(loss), " (logits ",
             dtype_name(ctx.inputs[0].dtype), "), got ", ctx.inputs[2].str());
    return std::vector<TensorType>{ctx.inputs[0]};
  };
  back.parse_args = parse_cross_entropy_args;
  back.kernels.push_back(
      {DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
         const Tensor& logits = ctx.inputs[0];
         const bool mean = ctx.args<CrossEntropyArgs>().mean;
         dispatch_float(logits.dtype(), "softmax_cross_entropy_backward", [&](auto tag) {
           using T = decltype(tag);
           int64_t n = logits.size(0), c = logits.size(1);
           double g = static_cast<double>(ctx.inputs[2].data<cross_entropy_loss_t<T>>()[0]) /
                      (mean ? static_cast<double>(n) : 1.0);
           T* out = ctx.outputs[0].data<T>();
           for_each_row<T>(logits, [&](int64_t i, const T* row, double lse) {
             int64_t y = label_at(ctx.inputs[1], i, c, ctx.op);
             for (int64_t j = 0; j < c; ++j) {
               double p = std::exp(static_cast<double>(row[j]) - lse);
               out[i * c + j] = static_cast<T>((p - (j == y ? 1.0 : 0.0)) * g);
             }
           });
         });
       }});
#ifdef QG_WITH_CUDA
  add_loss_cuda_kernels(r);
#endif
  add_loss_crosscheck(r);
}

}  // namespace qg
