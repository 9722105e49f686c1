// rms_norm (Llama's RMSNorm as transformers' LlamaRMSNorm computes it) and its backward op.
//   rms_norm           {x [..., D], weight [D]} -> {y [..., D], rstd [...]}
//   rms_norm_backward  {dy, x, weight, rstd} -> {dx, dweight}
// y = weight * T(x / sqrt(mean(x^2) + eps)) with the statistics and the normalisation in f32
// for f32/f16/bf16 inputs (transformers casts x to f32 first and the result back to x's
// dtype before the weight) and in f64 for f64 inputs (transformers would compute those in
// f32 too; f64 is this op's gradient-check reference, so it keeps f64 throughout). The sum
// of squares is an f64 sum in every dtype: exact products, and a sum whose only rounding
// hides below the f32 result. rstd (f32, or f64 for f64 inputs) is saved for the backward.
// The arithmetic, and the order of every sum, is rms_norm_math.h's.
//
// out_dtype (bf16/f16, from an f32 x) writes y narrowed: exactly cast(y) of the f32 op, since
// y is rounded to f32 first and then once to the narrow type, as the cast op rounds it. The
// fuse_norm_cast pass (rms_norm_cast_fusion.cpp) sets it where a mixed-precision model casts
// the norm's output to the GEMMs' dtype; the backward casts dy back to f32 first, as the
// cast's backward would.
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/graph.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/cast/cast_element.h"
#include "ops/common/schema_helpers.h"
#include "ops/rms_norm/rms_norm_args.h"
#include "ops/rms_norm/rms_norm_cast_fusion.h"
#include "ops/rms_norm/rms_norm_math.h"

namespace qg {
namespace {

using namespace rms_norm_math;

DType stats_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

AttrSpec eps_attr() {
  AttrSpec s = real_attr("eps", 1e-6, "added to the mean of the squares (Llama: rms_norm_eps)");
  s.validate = [](const std::string& op, const Attr& v) {
    const double e = v.as_real();
    QG_CHECK(std::isfinite(e) && e > 0, op, "attribute 'eps' = ", e, " must be finite and > 0");
  };
  return s;
}

// x has a non-empty last axis; weight is [D] of x's dtype.
void check_x_and_weight(const InferContext& ctx, int x_at, int w_at) {
  expect_float(ctx, x_at);
  const TensorType& x = ctx.inputs[x_at];
  QG_CHECK(!x.shape.empty() && x.shape.back() > 0, ctx.op,
           "x must have a non-empty last axis to normalise over, got ", x.str());
  expect_same_dtype(ctx, x_at, w_at);
  QG_CHECK(ctx.inputs[w_at].shape == Shape{x.shape.back()}, ctx.op, "weight must be [",
           x.shape.back(), "] (one value per element of the last axis), got ",
           ctx.inputs[w_at].str(), " for x ", x.str());
}

// y's dtype: x's, or a narrower one from an f32 x (others would round twice).
DType out_dtype_of(const std::string& op, const Attrs& attrs, DType x) {
  const std::string& name = attrs.get_string("out_dtype");
  if (name == "input") return x;
  const DType out = dtype_from_name(name);
  QG_CHECK(out == x || x == DType::f32, op, "attribute 'out_dtype' = '", name,
           "' narrows an f32 x only (y is the cast of the f32 result), got x of dtype ",
           dtype_name(x));
  return out;
}

TensorType rows_type(const TensorType& x) {
  return {stats_dtype(x.dtype), Shape(x.shape.begin(), x.shape.end() - 1)};
}

std::shared_ptr<const KernelArgs> parse_args(const ArgsSource& s) {
  auto a = std::make_shared<RmsNormArgs>();
  const TensorType& x = s.inputs.at(0);
  a->dim = x.shape.back();
  a->rows = x.numel() / a->dim;
  a->eps = s.attrs.get_real("eps");
  a->out = out_dtype_of(s.op, s.attrs, x.dtype);
  return a;
}

// The same layout for the backward op, from its x (input 1).
std::shared_ptr<const KernelArgs> parse_backward_args(const ArgsSource& s) {
  auto a = std::make_shared<RmsNormArgs>();
  const TensorType& x = s.inputs.at(1);
  a->dim = x.shape.back();
  a->rows = x.numel() / a->dim;
  return a;
}

// The f64 sum of f(j) over j < dim in kLanes order (rms_norm_math.h).
template <typename F>
double lane_sum(int64_t dim, F f) {
  double p[kLanes] = {};
  for (int64_t base = 0; base < dim; base += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, dim - base));
    for (int t = 0; t < n; ++t) p[t] += f(base + t);
  }
  return lane_tree(p);
}

int64_t row_grain(int64_t dim) {
  return std::max<int64_t>(1, kElementGrain / dim);
}

// O: y's element type, T's or (out_dtype) a narrower one for an f32 T.
template <typename T, typename O>
void forward_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const RmsNormArgs& a = ctx.args<RmsNormArgs>();
  const T* x = ctx.inputs[0].data<T>();
  const T* w = ctx.inputs[1].data<T>();
  O* y = ctx.outputs[0].data<O>();
  M* rstd = ctx.outputs[1].data<M>();
  const int64_t d = a.dim;
  parallel_for(
      a.rows, row_grain(d),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* p = x + r * d;
          const double ss = lane_sum(d, [&](int64_t j) {
            const double v = static_cast<double>(static_cast<M>(p[j]));
            return v * v;
          });
          const M rs = inv_rms<M>(ss, d, a.eps);
          rstd[r] = rs;
          for (int64_t j = 0; j < d; ++j) {
            const T h = static_cast<T>(static_cast<M>(p[j]) * rs);
            y[r * d + j] =
                cast_element<O>(static_cast<T>(static_cast<M>(w[j]) * static_cast<M>(h)));
          }
        }
      },
      a.rows * d);
}

template <typename T>
void backward_typed(KernelContext& ctx) {
  using M = math_t<T>;
  const RmsNormArgs& a = ctx.args<RmsNormArgs>();
  const T* dy = ctx.inputs[0].data<T>();
  const T* x = ctx.inputs[1].data<T>();
  const T* w = ctx.inputs[2].data<T>();
  const M* rstd = ctx.inputs[3].data<M>();
  T* dx = ctx.outputs[0].data<T>();
  const int64_t d = a.dim;
  parallel_for(
      a.rows, row_grain(d),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t o = r * d;
          auto g = [&](int64_t j) {
            return static_cast<M>(static_cast<T>(static_cast<M>(dy[o + j]) * static_cast<M>(w[j])));
          };
          const double s = lane_sum(d, [&](int64_t j) {
            return static_cast<double>(g(j)) * static_cast<double>(static_cast<M>(x[o + j]));
          });
          const M rs = rstd[r], k = dx_factor<M>(s, d, rs);
          for (int64_t j = 0; j < d; ++j)
            dx[o + j] = static_cast<T>(rs * g(j) - static_cast<M>(x[o + j]) * k);
        }
      },
      a.rows * d);
  // dweight: chunk sums of dy * h in row order, then the chunks in order.
  const int64_t chunks = num_chunks(a.rows, kRowsPerChunk);
  std::vector<double> part(static_cast<size_t>(chunks * d), 0.0);
  parallel_for(
      chunks, std::max<int64_t>(1, row_grain(d) / kRowsPerChunk),
      [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          double* acc = part.data() + c * d;
          const int64_t r1 = std::min(a.rows, (c + 1) * kRowsPerChunk);
          for (int64_t r = c * kRowsPerChunk; r < r1; ++r)
            for (int64_t j = 0; j < d; ++j) {
              const T h = static_cast<T>(static_cast<M>(x[r * d + j]) * rstd[r]);
              acc[j] += static_cast<double>(static_cast<M>(dy[r * d + j])) *
                        static_cast<double>(static_cast<M>(h));
            }
        }
      },
      a.rows * d);
  T* dw = ctx.outputs[1].data<T>();
  for (int64_t j = 0; j < d; ++j) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += part[static_cast<size_t>(c * d + j)];
    dw[j] = static_cast<T>(static_cast<M>(s));
  }
}

void rms_norm_cpu(KernelContext& ctx) {
  const DType out = ctx.args<RmsNormArgs>().out;
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(), [&](auto tag) {
    using T = decltype(tag);
    if (out == DType::bf16 && !std::is_same_v<T, bf16>) return forward_typed<T, bf16>(ctx);
    if (out == DType::f16 && !std::is_same_v<T, f16>) return forward_typed<T, f16>(ctx);
    forward_typed<T, T>(ctx);
  });
}

void rms_norm_backward_cpu(KernelContext& ctx) {
  dispatch_float(ctx.inputs[0].dtype(), ctx.op.c_str(),
                 [&](auto tag) { backward_typed<decltype(tag)>(ctx); });
}

void define_forward(OpRegistry& r) {
  OpDef& op = r.define("rms_norm");
  op.doc =
      "Llama's RMSNorm over the last axis: weight * T(x / sqrt(mean(x^2) + eps)), the "
      "statistics in f32 (f64 for f64 inputs); also returns rstd for the backward.";
  op.inputs = {"x", "weight"};
  op.outputs = {"y", "rstd"};
  op.attrs = {eps_attr(),
              string_attr("out_dtype", std::string("input"), {"input", "bf16", "f16"},
                          "y's dtype: x's (input), or bf16/f16 from an f32 x: exactly the f32 "
                          "result cast to it (the fusion of a mixed-precision GEMM input's "
                          "cast)")};
  op.parse_args = parse_args;
  op.differentiable_inputs = {true, true};
  op.infer = [](const InferContext& ctx) {
    check_x_and_weight(ctx, 0, 1);
    const TensorType& x = ctx.inputs[0];
    return std::vector<TensorType>{{out_dtype_of(ctx.op, ctx.attrs, x.dtype), x.shape},
                                   rows_type(x)};
  };
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, rms_norm_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    const Node& n = c.node;
    Graph& g = c.graph;
    ValueId dy = c.grad_or_zeros(0);
    const DType x = g.value(n.inputs[0]).type.dtype;
    // A narrowed y: its gradient widens back first, as a cast's backward does.
    if (g.value(dy).type.dtype != x)
      dy = g.apply1("cast", {dy}, {{"dtype", std::string(dtype_name(x))}});
    return g.apply("rms_norm_backward", {dy, n.inputs[0], n.inputs[1], n.outputs[1]});
  };
  op.fusion_rules = {rms_norm_cast_fusion_rule()};
  op.gradcheck_samples = [] {
    auto sample = [](const std::string& label, Shape x, double eps) {
      const int64_t d = x.back();
      return GradcheckSample{
          label, {GradcheckInput{x}, GradcheckInput{{d}, DType::f64, 0.5, 1.5}}, {{"eps", eps}}};
    };
    return std::vector<GradcheckSample>{sample("[4,5]", {4, 5}, 1e-6),
                                        sample("[2,3,40] eps 0.1", {2, 3, 40}, 0.1),
                                        sample("[3,1]", {3, 1}, 1e-5)};
  };
}

void define_backward(OpRegistry& r) {
  OpDef& back = r.define("rms_norm_backward");
  back.doc = "dx and dweight of rms_norm, from dy, x, weight and the saved rstd.";
  back.inputs = {"dy", "x", "weight", "rstd"};
  back.outputs = {"dx", "dweight"};
  back.parse_args = parse_backward_args;
  back.infer = [](const InferContext& ctx) {
    check_x_and_weight(ctx, 1, 2);
    const TensorType& x = ctx.inputs[1];
    QG_CHECK(ctx.inputs[0] == x, ctx.op, "dy ", ctx.inputs[0].str(), " must match x ", x.str());
    const TensorType rows = rows_type(x);
    QG_CHECK(ctx.inputs[3] == rows, ctx.op, "rstd must be ", rows.str(), " (one per row of x ",
             x.str(), "), got ", ctx.inputs[3].str());
    return std::vector<TensorType>{x, ctx.inputs[2]};
  };
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, rms_norm_backward_cpu});
}

}  // namespace

void add_rms_norm_cuda_kernels(OpRegistry& r);  // rms_norm_cuda.cu
void add_rms_norm_crosscheck(OpRegistry& r);    // rms_norm_crosscheck.cpp

void define_rms_norm_ops(OpRegistry& r) {
  define_forward(r);
  define_backward(r);
#ifdef QG_WITH_CUDA
  add_rms_norm_cuda_kernels(r);
#endif
  add_rms_norm_crosscheck(r);
}

}  // namespace qg
