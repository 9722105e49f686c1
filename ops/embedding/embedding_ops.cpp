// embedding: y[..., :] = weight[indices[...], :], a row gather; embedding_backward scatters
// dy back: dweight[v, :] = sum of dy[p, :] over the positions p with indices[p] == v. Only
// the weight is differentiable. The backward sums each row's contributions in position
// order in the math type (f32 for f32/f16/bf16, f64 for f64) and rounds once; the CUDA
// kernel sums in the same order, so the two backends agree bit for bit.
#include <cstring>

#include "core/error.h"
#include "core/graph.h"
#include "core/half.h"
#include "ops/common/grad_helpers.h"
#include "ops/common/schema_helpers.h"

namespace qg {
namespace {

void expect_index_dtype(const InferContext& ctx, int input) {
  DType d = ctx.inputs[input].dtype;
  QG_CHECK(d == DType::i64 || d == DType::i32, ctx.op, "input '", "indices",
           "' must be i64 or i32, got ", ctx.inputs[input].str());
}

template <typename I>
void read_checked_indices(const std::string& op, const Tensor& indices, int64_t rows,
                          std::vector<int64_t>& out) {
  const I* p = indices.data<I>();
  out.resize(static_cast<size_t>(indices.numel()));
  for (int64_t i = 0; i < indices.numel(); ++i) {
    int64_t v = static_cast<int64_t>(p[i]);
    QG_CHECK(v >= 0 && v < rows, op, "indices[", i, "] = ", v, " is outside [0, ", rows,
             ") (the weight has ", rows, " rows)");
    out[static_cast<size_t>(i)] = v;
  }
}

// The indices as int64, each checked against [0, rows).
std::vector<int64_t> checked_indices(const std::string& op, const Tensor& indices, int64_t rows) {
  std::vector<int64_t> out;
  if (indices.dtype() == DType::i32) {
    read_checked_indices<int32_t>(op, indices, rows, out);
  } else {
    read_checked_indices<int64_t>(op, indices, rows, out);
  }
  return out;
}

void embedding_cpu(KernelContext& ctx) {
  const Tensor& weight = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  const int64_t rows = weight.size(0), width = weight.size(1);
  std::vector<int64_t> idx = checked_indices(ctx.op, ctx.inputs[1], rows);
  const size_t row_bytes = static_cast<size_t>(width) * dtype_size(weight.dtype());
  if (row_bytes == 0) return;
  const char* src = static_cast<const char*>(weight.raw_data());
  char* dst = static_cast<char*>(y.raw_data());
  for (size_t p = 0; p < idx.size(); ++p)
    std::memcpy(dst + p * row_bytes, src + static_cast<size_t>(idx[p]) * row_bytes, row_bytes);
}

template <typename T>
void embedding_backward_cpu(const Tensor& dy, const std::vector<int64_t>& idx, Tensor& dw) {
  using M = math_t<T>;
  const int64_t width = dw.size(1);
  std::vector<M> acc(static_cast<size_t>(dw.numel()), M(0));
  const T* pdy = dy.data<T>();
  for (size_t p = 0; p < idx.size(); ++p) {
    M* row = acc.data() + idx[p] * width;
    const T* g = pdy + static_cast<int64_t>(p) * width;
    for (int64_t d = 0; d < width; ++d) row[d] += static_cast<M>(g[d]);
  }
  T* out = dw.data<T>();
  for (size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<T>(acc[i]);
}

}  // namespace

void add_embedding_cuda_kernels(OpRegistry& r);  // embedding_cuda.cu

void define_embedding_ops(OpRegistry& r) {
  OpDef& op = r.define("embedding");
  op.doc = "y[..., :] = weight[indices[...], :]; weight [V, D], indices i64/i32 of any shape.";
  op.inputs = {"weight", "indices"};
  op.outputs = {"y"};
  op.differentiable_inputs = {true, false};
  op.infer = [](const InferContext& ctx) {
    const TensorType& w = ctx.inputs[0];
    QG_CHECK(is_floating(w.dtype), ctx.op, "input 'weight' must be floating point, got ", w.str());
    QG_CHECK(w.shape.size() == 2, ctx.op, "input 'weight' must be 2-D [num_embeddings, dim], got ",
             w.str());
    expect_index_dtype(ctx, 1);
    Shape out = ctx.inputs[1].shape;
    out.push_back(w.shape[1]);
    return std::vector<TensorType>{{w.dtype, out}};
  };
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, embedding_cpu});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    Shape w = shape_of(c.graph, c.node.inputs[0]);
    return {c.graph.apply1("embedding_backward", {c.grad_or_zeros(0), c.node.inputs[1]},
                           {{"num_embeddings", w[0]}}),
            kNoValue};
  };
  op.gradcheck_samples = [] {
    // Repeated indices: rows 0 and 2 each collect several gradient rows.
    GradcheckSample repeated{"[5,3] by i64 [2,3], repeats", {{{5, 3}}, {{2, 3}, DType::i64}}, {}};
    repeated.inputs[1].values = {0, 2, 2, 4, 0, 2};
    GradcheckSample i32{"[4,2] by i32 [4]", {{{4, 2}}, {{4}, DType::i32}}, {}};
    i32.inputs[1].values = {1, 1, 3, 0};
    return std::vector<GradcheckSample>{repeated, i32};
  };

  OpDef& back = r.define("embedding_backward");
  back.doc = "dweight [num_embeddings, D]: row v is the sum of dy rows whose index is v.";
  back.inputs = {"dy", "indices"};
  back.outputs = {"dweight"};
  back.attrs = {int_attr("num_embeddings", std::nullopt, "rows of the weight (V)", 0)};
  back.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    expect_index_dtype(ctx, 1);
    const Shape& dy = ctx.inputs[0].shape;
    const Shape& idx = ctx.inputs[1].shape;
    QG_CHECK(dy.size() == idx.size() + 1 && std::equal(idx.begin(), idx.end(), dy.begin()), ctx.op,
             "dy ", ctx.inputs[0].str(), " must be the indices' shape ", shape_str(idx),
             " plus one embedding axis");
    return std::vector<TensorType>{
        {ctx.inputs[0].dtype, {ctx.attrs.get_int("num_embeddings"), dy.back()}}};
  };
  back.parse_args = no_kernel_args;  // the row count is the output's
  back.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                            Tensor& dw = ctx.outputs[0];
                            std::vector<int64_t> idx =
                                checked_indices(ctx.op, ctx.inputs[1], dw.size(0));
                            dispatch_float(dw.dtype(), "embedding_backward", [&](auto tag) {
                              embedding_backward_cpu<decltype(tag)>(ctx.inputs[0], idx, dw);
                            });
                          }});
#ifdef QG_WITH_CUDA
  add_embedding_cuda_kernels(r);
#endif
}

}  // namespace qg
