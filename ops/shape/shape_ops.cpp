// permute and transpose: contiguous copies with reordered axes, for every dtype. transpose is
// a permute that swaps two axes and runs the same kernel; each is its own op so that its
// attributes (and its error messages) are the ones the user wrote. The kernels read x through
// its strides, so a direct call may pass a slice or a permuted view (y is contiguous).
// Backward: permute by the inverse permutation, transpose by the same pair. (reshape lives in
// ops/arith.)
#include <cstring>

#include "core/error.h"
#include "core/graph.h"
#include "ops/common/schema_helpers.h"
#include "ops/shape/permute_plan.h"

namespace qg {
namespace {

template <typename E>
void gather_cpu(const E* src, E* dst, const PermutePlan& p) {
  const int rank = static_cast<int>(p.sizes.size());
  if (rank == 0) {
    dst[0] = src[0];
    return;
  }
  int64_t n = 1;
  for (int64_t s : p.sizes) n *= s;
  if (n == 0) return;
  const int64_t inner = p.sizes.back(), inner_stride = p.src_strides.back();
  std::vector<int64_t> idx(rank, 0);
  for (int64_t base = 0; base < n; base += inner) {
    int64_t off = 0;
    for (int d = 0; d < rank - 1; ++d) off += idx[d] * p.src_strides[d];
    for (int64_t j = 0; j < inner; ++j) dst[base + j] = src[off + j * inner_stride];
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < p.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

void permute_cpu(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  Tensor& y = ctx.outputs[0];
  if (y.numel() == 0) return;
  const PermutePlan plan = permute_plan_of(ctx.args<PermuteArgs>(), x);
  const void* src = x.raw_data();
  void* dst = y.raw_data();
  switch (dtype_size(x.dtype())) {
    case 1:
      return gather_cpu(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), plan);
    case 2:
      return gather_cpu(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), plan);
    case 4:
      return gather_cpu(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), plan);
    case 8:
      return gather_cpu(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), plan);
    default:
      QG_FAIL(ctx.op, "no permute for elements of ", dtype_size(x.dtype()), " bytes (",
              dtype_name(x.dtype()), ")");
  }
}

std::vector<TensorType> infer_permuted(const InferContext& ctx) {
  const TensorType& x = ctx.inputs[0];
  std::vector<int64_t> perm = perm_of(ctx.op, ctx.attrs, static_cast<int>(x.shape.size()));
  Shape out(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out[i] = x.shape[perm[i]];
  return {TensorType{x.dtype, out}};
}

}  // namespace

void add_shape_cuda_kernels(OpRegistry& r);  // shape_cuda.cu

void define_shape_ops(OpRegistry& r) {
  OpDef& permute = r.define("permute");
  permute.doc = "y = x with axes reordered: y.shape[i] = x.shape[perm[i]] (contiguous copy).";
  permute.inputs = {"x"};
  permute.outputs = {"y"};
  permute.attrs = {ints_attr("perm", std::nullopt,
                             "a permutation of 0..rank-1 (negative entries count from the end)")};
  permute.differentiable_inputs = {true};
  permute.infer = infer_permuted;
  permute.parse_args = parse_permute_args;
  permute.kernels.push_back({DeviceType::cpu, {}, permute_cpu, /*strided=*/true});
  permute.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    std::vector<int64_t> perm =
        checked_perm("permute", c.node.attrs.get_ints("perm"),
                     static_cast<int>(c.node.attrs.get_ints("perm").size()));
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
    return {c.graph.apply1("permute", {c.grad_or_zeros(0)}, {{"perm", inverse}})};
  };
  permute.gradcheck_samples = [] {
    std::vector<GradcheckSample> s;
    s.push_back({"[2,3,4,5] perm (2,0,3,1)", {{{2, 3, 4, 5}}}, {{"perm", Shape{2, 0, 3, 1}}}});
    s.push_back({"[3,4] perm (-1,0)", {{{3, 4}}}, {{"perm", Shape{-1, 0}}}});
    return s;
  };

  OpDef& transpose = r.define("transpose");
  transpose.doc = "y = x with axes dim0 and dim1 swapped (contiguous copy).";
  transpose.inputs = {"x"};
  transpose.outputs = {"y"};
  transpose.attrs = {int_attr("dim0", std::nullopt, "first axis (negative counts from the end)"),
                     int_attr("dim1", std::nullopt, "second axis (negative counts from the end)")};
  transpose.differentiable_inputs = {true};
  transpose.infer = infer_permuted;
  transpose.parse_args = parse_permute_args;
  transpose.kernels.push_back({DeviceType::cpu, {}, permute_cpu, /*strided=*/true});
  transpose.backward = [](BackwardContext& c) -> std::vector<ValueId> {
    return {c.graph.apply1("transpose", {c.grad_or_zeros(0)}, c.node.attrs)};
  };
  transpose.gradcheck_samples = [] {
    std::vector<GradcheckSample> s;
    s.push_back({"[3,4,5] dims (0,-1)", {{{3, 4, 5}}}, {{"dim0", 0}, {"dim1", -1}}});
    s.push_back({"[2,3,4,5] dims (1,2)", {{{2, 3, 4, 5}}}, {{"dim0", 1}, {"dim1", 2}}});
    return s;
  };
#ifdef QG_WITH_CUDA
  add_shape_cuda_kernels(r);
#endif
}

}  // namespace qg
