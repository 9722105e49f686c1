// batched_matmul: y[b] = op(a[b]) @ op(b[b]) over equal leading batch dimensions (rank >= 3,
// no broadcasting), op = optional transpose of the last two axes. As for matmul, the flags let
// the backward rule be batched_matmul itself.
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

// One GEMM per batch on [rows, cols] row-major slices, on the thread pool: f32/f64 as tasks
// of (batch, row block) (ops/linalg/gemm_blocks.h), f16/bf16 one task per batch, widened to
// f32 and rounded once, as matmul does.
template <typename T>
void batched_matmul_cpu(const Tensor& a, const Tensor& b, Tensor& y, bool ta, bool tb) {
  using M = math_t<T>;
  const int r = a.dim();
  const int64_t ar = a.size(r - 2), ac = a.size(r - 1), br = b.size(r - 2), bc = b.size(r - 1);
  const int64_t m = y.size(r - 2), n = y.size(r - 1);
  const int64_t batches = m * n == 0 ? 0 : y.numel() / (m * n);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* py = y.data<T>();
  if constexpr (std::is_same_v<T, M>) {
    const int64_t blocks = gemm::row_blocks(m);
    parallel_chunks(
        batches * blocks,
        [&](int64_t task) {
          const int64_t i = task / blocks;
          gemm::product_rows<M>(pa + i * ar * ac, ar, ac, pb + i * br * bc, br, bc, py + i * m * n,
                                n, ta, tb, gemm::row_block(m, task % blocks));
        },
        batches * gemm::product_work(m, n, ta ? ar : ac));
  } else {
    parallel_chunks(
        batches,
        [&](int64_t i) {
          auto load = [](const T* p, int64_t rows, int64_t cols) {
            RowMat<M> mat(rows, cols);
            for (int64_t k = 0; k < rows * cols; ++k) mat.data()[k] = static_cast<M>(p[k]);
            return mat;
          };
          RowMat<M> ma = load(pa + i * ar * ac, ar, ac), mb = load(pb + i * br * bc, br, bc);
          RowMat<M> ra = ta ? RowMat<M>(ma.transpose()) : ma;
          RowMat<M> rb = tb ? RowMat<M>(mb.transpose()) : mb;
          RowMat<M> out = ra * rb;
          T* sy = py + i * m * n;
          for (int64_t k = 0; k < m * n; ++k) sy[k] = static_cast<T>(out.data()[k]);
        },
        batches * gemm::product_work(m, n, ta ? ar : ac));
  }
}

}  // namespace

void define_batched_matmul_op(OpRegistry& r) {
  OpDef& op = r.define("batched_matmul");
  op.doc =
      "y[..., :, :] = op(a[..., :, :]) @ op(b[..., :, :]); a [B..., M, K], b [B..., K, N], equal "
      "batch dimensions, rank >= 3; op = transpose of the last two axes when flagged.";
  op.inputs = {"a", "b"};
  op.outputs = {"y"};
  op.attrs = {bool_attr("transpose_a", false, "use a's last two axes swapped"),
              bool_attr("transpose_b", false, "use b's last two axes swapped")};
  op.differentiable_inputs = {true, true};
  op.infer = [](const InferContext& ctx) {
    expect_float(ctx, 0);
    expect_float(ctx, 1);
    expect_same_dtype(ctx, 0, 1);
    const Shape& a = ctx.inputs[0].shape;
    const Shape& b = ctx.inputs[1].shape;
    QG_CHECK(a.size() >= 3 && b.size() >= 3, ctx.op,
             "a and b must have rank >= 3 ([batch..., rows, cols]; use matmul for 2-D), got a ",
             ctx.inputs[0].str(), ", b ", ctx.inputs[1].str());
    const size_t r = a.size();
    QG_CHECK(b.size() == r && std::equal(a.begin(), a.end() - 2, b.begin()), ctx.op,
             "batch dimensions differ (no broadcasting): a ", shape_str(a), ", b ", shape_str(b));
    bool ta = ctx.attrs.get_bool("transpose_a"), tb = ctx.attrs.get_bool("transpose_b");
    int64_t m = ta ? a[r - 1] : a[r - 2], ka = ta ? a[r - 2] : a[r - 1];
    int64_t kb = tb ? b[r - 1] : b[r - 2], n = tb ? b[r - 2] : b[r - 1];
    QG_CHECK(ka == kb, ctx.op, "inner dimensions differ: op(a) is [..., ", m, ", ", ka,
             "], op(b) is [..., ", kb, ", ", n, "] (a ", shape_str(a), ", b ", shape_str(b),
             ", transpose_a=", ta, ", transpose_b=", tb, ")");
    Shape out(a.begin(), a.end() - 2);
    out.push_back(m);
    out.push_back(n);
    return std::vector<TensorType>{{ctx.inputs[0].dtype, out}};
  };
  op.parse_args = parse_matmul_args;
  op.kernels.push_back({DeviceType::cpu, kFloatDTypes, [](KernelContext& ctx) {
                          const MatmulArgs& args = ctx.args<MatmulArgs>();
                          const bool ta = args.transpose_a, tb = args.transpose_b;
                          dispatch_float(ctx.inputs[0].dtype(), "batched_matmul", [&](auto tag) {
                            batched_matmul_cpu<decltype(tag)>(ctx.inputs[0], ctx.inputs[1],
                                                              ctx.outputs[0], ta, tb);
                          });
                        }});
  // The matmul rule per batch: with y = op(a) op(b), dA = dy op(b)^T (transposed back when
  // a was), dB = op(a)^T dy (likewise).
  op.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    ValueId dy = c.grad_or_zeros(0);
    ValueId a = c.node.inputs[0], b = c.node.inputs[1];
    bool ta = c.node.attrs.get_bool("transpose_a"), tb = c.node.attrs.get_bool("transpose_b");
    const char* bmm = "batched_matmul";
    ValueId da = kNoValue, db = kNoValue;
    if (c.needs_input_grad[0]) {
      da = ta ? c.graph.apply1(bmm, {b, dy}, {{"transpose_a", tb}, {"transpose_b", true}})
              : c.graph.apply1(bmm, {dy, b}, {{"transpose_b", !tb}});
    }
    if (c.needs_input_grad[1]) {
      db = tb ? c.graph.apply1(bmm, {dy, a}, {{"transpose_a", true}, {"transpose_b", ta}})
              : c.graph.apply1(bmm, {a, dy}, {{"transpose_a", !ta}});
    }
    return {da, db};
  };
  op.gradcheck_samples = [] {
    std::vector<GradcheckSample> s;
    s.push_back({"[2,3,4]@[2,4,5]", {{{2, 3, 4}}, {{2, 4, 5}}}, {}});
    s.push_back(
        {"[2,2,4,3]^T@[2,2,4,5]", {{{2, 2, 4, 3}}, {{2, 2, 4, 5}}}, {{"transpose_a", true}}});
    s.push_back({"[3,3,4]@[3,5,4]^T", {{{3, 3, 4}}, {{3, 5, 4}}}, {{"transpose_b", true}}});
    s.push_back({"[2,4,3]^T@[2,5,4]^T",
                 {{{2, 4, 3}}, {{2, 5, 4}}},
                 {{"transpose_a", true}, {"transpose_b", true}}});
    return s;
  };
}

}  // namespace qg
