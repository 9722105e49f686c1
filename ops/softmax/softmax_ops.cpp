// softmax along one axis and its backward. The tensor is read as [outer, axis_len, inner];
// each (outer, inner) column is one softmax. The math runs in math_t (f32 for f32/f16/bf16,
// f64 for f64): y = exp(x - max) / sum(exp(x - max)). A column of all -inf has max -inf, so
// x - max is NaN and the whole column is NaN, as in PyTorch; a NaN anywhere in a column makes
// the column NaN. The backward is its own op, dx = y * (dy - sum(dy * y)), because it needs
// the per-column sum that no element-wise op provides.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/common/schema_helpers.h"
#include "ops/softmax/softmax_columns.h"

namespace qg {
namespace {

// Each outer index is a slab [axis_len, inner] whose `inner` columns are reduced together,
// walking the slab in memory order (rows of `inner` contiguous elements) with one
// accumulator per column; every column still sees its elements in axis order.
// Slabs per chunk of the parallel loops: about kElementGrain elements, at least one slab.
// Slabs are independent, so the bytes do not depend on the thread count.
int64_t slab_grain(const SoftmaxColumns& c) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(c.axis_len * c.inner, 1));
}

template <typename T>
void softmax_cpu(const Tensor& x, Tensor& y, const SoftmaxColumns& c) {
  using M = math_t<T>;
  const int64_t len = c.axis_len, inner = c.inner;
  parallel_for(
      c.outer, slab_grain(c),
      [&](int64_t o0, int64_t o1) {
        std::vector<M> e(static_cast<size_t>(len * inner)), mx(inner), sum(inner);
        for (int64_t o = o0; o < o1; ++o) {
          const T* px = x.data<T>() + o * len * inner;
          T* py = y.data<T>() + o * len * inner;
          std::fill(mx.begin(), mx.end(), static_cast<M>(-INFINITY));
          std::fill(sum.begin(), sum.end(), M(0));
          for (int64_t a = 0; a < len; ++a)
            for (int64_t i = 0; i < inner; ++i) {
              M v = static_cast<M>(px[a * inner + i]);
              mx[i] = v > mx[i] ? v : mx[i];
            }
          for (int64_t a = 0; a < len; ++a)
            for (int64_t i = 0; i < inner; ++i) {
              M v = std::exp(static_cast<M>(px[a * inner + i]) - mx[i]);
              e[a * inner + i] = v;
              sum[i] += v;
            }
          for (int64_t a = 0; a < len; ++a)
            for (int64_t i = 0; i < inner; ++i)
              py[a * inner + i] = static_cast<T>(e[a * inner + i] / sum[i]);
        }
      },
      c.outer * len * inner);
}

template <typename T>
void softmax_backward_cpu(const Tensor& dy, const Tensor& y, Tensor& dx, const SoftmaxColumns& c) {
  using M = math_t<T>;
  const int64_t len = c.axis_len, inner = c.inner;
  parallel_for(
      c.outer, slab_grain(c),
      [&](int64_t o0, int64_t o1) {
        std::vector<M> dot(inner);
        for (int64_t o = o0; o < o1; ++o) {
          const T* pdy = dy.data<T>() + o * len * inner;
          const T* py = y.data<T>() + o * len * inner;
          T* pdx = dx.data<T>() + o * len * inner;
          std::fill(dot.begin(), dot.end(), M(0));
          for (int64_t a = 0; a < len; ++a)
            for (int64_t i = 0; i < inner; ++i)
              dot[i] += static_cast<M>(pdy[a * inner + i]) * static_cast<M>(py[a * inner + i]);
          for (int64_t a = 0; a < len; ++a)
            for (int64_t i = 0; i < inner; ++i) {
              const int64_t k = a * inner + i;
              pdx[k] = static_cast<T>(static_cast<M>(py[k]) * (static_cast<M>(pdy[k]) - dot[i]));
            }
        }
      },
      c.outer * len * inner);
}

}  // namespace

void add_softmax_cuda_kernels(OpRegistry& r);  // softmax_cuda.cu
void add_softmax_crosscheck(OpRegistry& r);    // softmax_crosscheck.cpp

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
  op.parse_args = parse_softmax_args;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          const SoftmaxColumns& c = ctx.args<SoftmaxArgs>().columns;
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
  back.parse_args = parse_softmax_args;
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                            const SoftmaxColumns& c = ctx.args<SoftmaxArgs>().columns;
                            dispatch_float(ctx.inputs[0].dtype(), "softmax_backward", [&](auto t) {
                              softmax_backward_cpu<decltype(t)>(ctx.inputs[0], ctx.inputs[1],
                                                                ctx.outputs[0], c);
                            });
                          }});
#ifdef QG_WITH_CUDA
  add_softmax_cuda_kernels(r);
#endif
  add_softmax_crosscheck(r);
}

}  // namespace qg
