// matmul: y = op(a) @ op(b) for 2-D tensors, op = optional transpose. The transpose flags
// let the backward rule express dA and dB without a separate transpose op.
#include <Eigen/Core>

#include "core/error.h"
#include "core/graph.h"
#include "core/half.h"
#include "ops/common/schema_helpers.h"
#include "ops/linalg/gemm_blocks.h"
#include "ops/linalg/matmul_args.h"

namespace qg {
namespace {

template <typename M>
using RowMat = gemm::RowMat<M>;

// Row blocks of the product on the thread pool (ops/linalg/gemm_blocks.h); f16/bf16 are
// widened to f32, multiplied, and rounded once.
template <typename T>
void matmul_cpu(const Tensor& a, const Tensor& b, Tensor& y, bool ta, bool tb) {
  using M = math_t<T>;
  const int64_t m = y.size(0), n = y.size(1);
  if (y.numel() == 0) return;
  if constexpr (std::is_same_v<T, M>) {
    gemm::product<M>(a.data<T>(), a.size(0), a.size(1), b.data<T>(), b.size(0), b.size(1),
                     y.data<T>(), m, n, ta, tb);
  } else {
    auto load = [](const Tensor& t) {
      RowMat<M> mat(t.size(0), t.size(1));
      const T* p = t.data<T>();
      for (int64_t i = 0; i < t.numel(); ++i) mat.data()[i] = static_cast<M>(p[i]);
      return mat;
    };
    RowMat<M> ma = load(a), mb = load(b);
    RowMat<M> ra = ta ? RowMat<M>(ma.transpose()) : ma;
    RowMat<M> rb = tb ? RowMat<M>(mb.transpose()) : mb;
    T* py = y.data<T>();
    parallel_chunks(
        gemm::row_blocks(m),
        [&](int64_t blk) {
          const gemm::Rows r = gemm::row_block(m, blk);
          RowMat<M> out(r.count, n);
          out.noalias() = ra.middleRows(r.begin, r.count) * rb;
          for (int64_t i = 0; i < r.count * n; ++i)
            py[r.begin * n + i] = static_cast<T>(out.data()[i]);
        },
        gemm::product_work(m, n, ra.cols()));
  }
}

}  // namespace

void define_batched_matmul_op(OpRegistry& r);  // batched_matmul_op.cpp

void add_linalg_cuda_kernels(OpRegistry& r);  // linalg_cuda.cu
void add_linalg_crosscheck(OpRegistry& r);    // linalg_crosscheck.cpp

void define_linalg_ops(OpRegistry& r) {
  OpDef& op = r.define("matmul");
  op.doc = "y = op(a) @ op(b), 2-D, op = transpose when transpose_a/transpose_b is set.";
  op.inputs = {"a", "b"};
  op.outputs = {"y"};
  op.attrs = {bool_attr("transpose_a", false, "use a^T"),
              bool_attr("transpose_b", false, "use b^T")};
  op.differentiable_inputs = {true, true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    expect_float(ctx, 1);
    expect_same_dtype(ctx, 0, 1);
    expect_rank(ctx, 0, 2);
    expect_rank(ctx, 1, 2);
    bool ta = ctx.attrs.get_bool("transpose_a"), tb = ctx.attrs.get_bool("transpose_b");
    const Shape& a = ctx.inputs[0].shape;
    const Shape& b = ctx.inputs[1].shape;
    int64_t m = ta ? a[1] : a[0], ka = ta ? a[0] : a[1];
    int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
    QG_CHECK(ka == kb, ctx.op, "inner dimensions differ: op(a) is [", m, ", ", ka, "], op(b) is [",
             kb, ", ", n, "] (a ", shape_str(a), ", b ", shape_str(b), ", transpose_a=", ta,
             ", transpose_b=", tb, ")");
    return std::vector<TensorType>{{ctx.inputs[0].dtype, {m, n}}};
  };
  op.parse_args = parse_matmul_args;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          const MatmulArgs& args = ctx.args<MatmulArgs>();
                          const bool ta = args.transpose_a, tb = args.transpose_b;
                          dispatch_float(ctx.inputs[0].dtype(), "matmul", [&](auto tag) {
                            matmul_cpu<decltype(tag)>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0],
                                                      ta, tb);
                          });
                        }});
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    ValueId dy = c.grad_or_zeros(0);
    ValueId a = c.node.inputs[0], b = c.node.inputs[1];
    bool ta = c.node.attrs.get_bool("transpose_a"), tb = c.node.attrs.get_bool("transpose_b");
    ValueId da = kNoValue, db = kNoValue;
    if (c.needs_input_grad[0]) {
      da = ta ? c.graph.apply1("matmul", {b, dy}, {{"transpose_a", tb}, {"transpose_b", true}})
              : c.graph.apply1("matmul", {dy, b}, {{"transpose_b", !tb}});
    }
    if (c.needs_input_grad[1]) {
      db = tb ? c.graph.apply1("matmul", {dy, a}, {{"transpose_a", true}, {"transpose_b", ta}})
              : c.graph.apply1("matmul", {a, dy}, {{"transpose_a", !ta}});
    }
    return {da, db};
  };
  op.gradcheck_samples = [] {
    std::vector<GradcheckSample> s;
    s.push_back({"[3,4]@[4,5]", {{{3, 4}}, {{4, 5}}}, {}});
    s.push_back({"[4,3]^T@[4,5]", {{{4, 3}}, {{4, 5}}}, {{"transpose_a", true}}});
    s.push_back({"[3,4]@[5,4]^T", {{{3, 4}}, {{5, 4}}}, {{"transpose_b", true}}});
    s.push_back(
        {"[4,3]^T@[5,4]^T", {{{4, 3}}, {{5, 4}}}, {{"transpose_a", true}, {"transpose_b", true}}});
    return s;
  };
  define_batched_matmul_op(r);
#ifdef QG_WITH_CUDA
  add_linalg_cuda_kernels(r);
#endif
  add_linalg_crosscheck(r);
}

}  // namespace qg
