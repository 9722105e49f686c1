// softmax along one axis and its backward. The tensor is read as [outer, axis_len, inner];
// each (outer, inner) column is one softmax. The math runs in math_t (f32 for f32/f16/bf16,
// f64 for f64): y = exp(x - max) / sum(exp(x - max)). A column of all -inf has max -inf, so
// x - max is NaN and the whole column is NaN, as in PyTorch; a NaN anywhere in a column makes
// the column NaN. The backward is its own op, dx = y * (dy - sum(dy * y)), because it needs
// the per-column sum that no element-wise op provides.
#include <cmath>

#include "core/error.h"
#include "core/graph.h"
#include "core/half.h"
#include "ops/common/schema_helpers.h"
#include "ops/softmax/softmax_columns.h"

namespace qg {
namespace {

const std::vector<DType> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

template <typename T>
void softmax_cpu(const Tensor& x, Tensor& y, const SoftmaxColumns& c) {
  using M = math_t<T>;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  std::vector<M> e(static_cast<size_t>(c.axis_len));
  for (int64_t o = 0; o < c.outer; ++o) {
    for (int64_t i = 0; i < c.inner; ++i) {
      const int64_t base = o * c.axis_len * c.inner + i;
      M mx = -INFINITY;
      for (int64_t a = 0; a < c.axis_len; ++a) {
        M v = static_cast<M>(px[base + a * c.inner]);
        mx = v > mx ? v : mx;
      }
      M sum = 0;
      for (int64_t a = 0; a < c.axis_len; ++a) {
        e[a] = std::exp(static_cast<M>(px[base + a * c.inner]) - mx);
        sum += e[a];
      }
      for (int64_t a = 0; a < c.axis_len; ++a) py[base + a * c.inner] = static_cast<T>(e[a] / sum);
    }
  }
}

template <typename T>
void softmax_backward_cpu(const Tensor& dy, const Tensor& y, Tensor& dx, const SoftmaxColumns& c) {
  using M = math_t<T>;
  const T* pdy = dy.data<T>();
  const T* py = y.data<T>();
  T* pdx = dx.data<T>();
  for (int64_t o = 0; o < c.outer; ++o) {
    for (int64_t i = 0; i < c.inner; ++i) {
      const int64_t base = o * c.axis_len * c.inner + i;
      M dot = 0;
      for (int64_t a = 0; a < c.axis_len; ++a) {
        int64_t k = base + a * c.inner;
        dot += static_cast<M>(pdy[k]) * static_cast<M>(py[k]);
      }
      for (int64_t a = 0; a < c.axis_len; ++a) {
        int64_t k = base + a * c.inner;
        pdx[k] = static_cast<T>(static_cast<M>(py[k]) * (static_cast<M>(pdy[k]) - dot));
      }
    }
  }
}

}  // namespace

void define_softmax_ops(OpRegistry& r) {
  OpDef& op = r.define("softmax");
  op.doc =
      "y = exp(x - max) / sum(exp(x - max)) along `axis` (math in f32, f64 for f64); a column "
      "of all -inf gives NaN.";
  op.inputs = {"x"};
  op.outputs = {"y"};
  op.attrs = {int_attr("axis", -1, "the softmax axis; negative counts from the end")};
  op.differentiable_inputs = {true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    softmax_axis(ctx.op, ctx.attrs, static_cast<int>(ctx.inputs[0].shape.size()));
    return same_as_input(ctx);
  };
  op.kernels.push_back({DeviceType::cpu, kFloatTypes, [](KernelContext& ctx) {
                          SoftmaxColumns c = softmax_columns(ctx.op, ctx.attrs, ctx.inputs[0]);
                          dispatch_float(ctx.inputs[0].dtype(), "softmax", [&](auto tag) {
                            softmax_cpu<decltype(tag)>(ctx.inputs[0], ctx.outputs[0], c);
                          });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("softmax_backward", {c.grad_or_zeros(0), c.node.outputs[0]},
                           {{"axis", c.node.attrs.get_int("axis")}})};
  };
  op.gradcheck_samples = [] {
    std::vector<GradcheckSample> s;
    s.push_back({"[3,4] axis 0", {{{3, 4}, DType::f64, -2, 2}}, {{"axis", 0}}});
    s.push_back({"[3,4] axis 1", {{{3, 4}, DType::f64, -2, 2}}, {{"axis", 1}}});
    s.push_back({"[2,3,5] axis -1", {{{2, 3, 5}, DType::f64, -2, 2}}, {{"axis", -1}}});
    s.push_back({"[2,3,4] axis 1 (middle)", {{{2, 3, 4}, DType::f64, -2, 2}}, {{"axis", 1}}});
    return s;
  };

  OpDef& back = r.define("softmax_backward");
  back.doc = "dx = y * (dy - sum(dy * y, axis)), y the softmax output.";
  back.inputs = {"dy", "y"};
  back.outputs = {"dx"};
  back.attrs = {int_attr("axis", -1, "as in the forward op")};
  back.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    expect_same_dtype(ctx, 0, 1);
    QG_CHECK(ctx.inputs[0].shape == ctx.inputs[1].shape, ctx.op, "dy ", ctx.inputs[0].str(),
             " and y ", ctx.inputs[1].str(), " must have the same shape");
    softmax_axis(ctx.op, ctx.attrs, static_cast<int>(ctx.inputs[0].shape.size()));
    return same_as_input(ctx);
  };
  back.kernels.push_back({DeviceType::cpu, kFloatTypes, [](KernelContext& ctx) {
                            SoftmaxColumns c = softmax_columns(ctx.op, ctx.attrs, ctx.inputs[0]);
                            dispatch_float(ctx.inputs[0].dtype(), "softmax_backward", [&](auto t) {
                              softmax_backward_cpu<decltype(t)>(ctx.inputs[0], ctx.inputs[1],
                                                                ctx.outputs[0], c);
                            });
                          }});
}

}  // namespace qg
