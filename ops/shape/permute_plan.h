// The gather plan of a permute, shared by the CPU and CUDA kernels: output dimension i has
// size in_shape[perm[i]] and reads the input with stride in_strides[perm[i]] (the input's
// contiguous strides, or a strided view's own). Size-1 dimensions are dropped and neighbours
// that stay contiguous in the input are merged, so a rank-6 permute that only swaps two blocks
// of axes becomes a rank-2 transpose.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/op_schema.h"
#include "core/tensor.h"
#include "ops/common/schema_helpers.h"

namespace qg {

struct PermutePlan {
  std::vector<int64_t> sizes;        // collapsed output dimensions (outermost first)
  std::vector<int64_t> src_strides;  // input stride of each, in elements
};

// The plan of reading an input of shape `in` laid out with `in_strides` (elements, any
// non-negative values: a strided view) in the order `perm`. perm must already be a validated
// permutation of 0..rank-1.
inline PermutePlan make_permute_plan(const Shape& in, const Shape& in_strides,
                                     const std::vector<int64_t>& perm) {
  const int rank = static_cast<int>(in.size());
  PermutePlan p;
  for (int i = 0; i < rank; ++i) {
    int64_t size = in[perm[i]], stride = in_strides[perm[i]];
    if (size == 1) continue;
    if (!p.sizes.empty() && p.src_strides.back() == stride * size) {
      p.sizes.back() *= size;
      p.src_strides.back() = stride;
      continue;
    }
    p.sizes.push_back(size);
    p.src_strides.push_back(stride);
  }
  return p;
}

// The same for a contiguous input.
inline PermutePlan make_permute_plan(const Shape& in, const std::vector<int64_t>& perm) {
  return make_permute_plan(in, contiguous_strides(in), perm);
}

// Normalises a perm attribute (negative entries count from the end) and checks that it is a
// permutation of 0..rank-1; throws naming the op, the attribute and its value.
inline std::vector<int64_t> checked_perm(const std::string& op, const std::vector<int64_t>& perm,
                                         int rank) {
  QG_CHECK(static_cast<int>(perm.size()) == rank, op, "attribute 'perm' = ", shape_str(perm),
           " has ", perm.size(), " entries for an input of rank ", rank);
  std::vector<int64_t> out(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t a = perm[i] < 0 ? perm[i] + rank : perm[i];
    QG_CHECK(a >= 0 && a < rank && !seen[a], op, "attribute 'perm' = ", shape_str(perm),
             " is not a permutation of 0..", rank - 1);
    seen[a] = true;
    out[i] = a;
  }
  return out;
}

// The permutation a permute or transpose node applies (`op` is its op name, `attrs` its
// attributes), checked: permute's perm, or the identity with transpose's dim0 and dim1 swapped.
// Shared by the permute kernels and the fused ste_backward + permute node (ops/fused).
inline std::vector<int64_t> perm_of(const std::string& op, const Attrs& attrs, int rank) {
  if (op != "transpose") return checked_perm(op, attrs.get_ints("perm"), rank);
  const int d0 = normalize_axis(op, "dim0", attrs.get_int("dim0"), rank);
  const int d1 = normalize_axis(op, "dim1", attrs.get_int("dim1"), rank);
  std::vector<int64_t> perm(rank);
  for (int i = 0; i < rank; ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  return perm;
}

// The parsed arguments of permute and transpose, read by their CPU and CUDA kernels and by the
// fused kernels that run a permute or transpose part.
struct PermuteArgs : KernelArgs {
  std::vector<int64_t> perm;  // checked against x's rank
  PermutePlan plan;           // over x's shape
};

// The plan of one call: the parsed one for a contiguous x, else one over x's strides (the
// permute kernels read strided views; the plan parsed from x's type assumes a contiguous x).
inline PermutePlan permute_plan_of(const PermuteArgs& args, const Tensor& x) {
  return x.is_contiguous() ? args.plan : make_permute_plan(x.shape(), x.strides(), args.perm);
}

inline std::shared_ptr<const KernelArgs> parse_permute_args(const ArgsSource& s) {
  QG_CHECK(!s.inputs.empty(), s.op, "has no input to permute");
  const Shape& x = s.inputs[0].shape;
  auto args = std::make_shared<PermuteArgs>();
  args->perm = perm_of(s.op, s.attrs, static_cast<int>(x.size()));
  args->plan = make_permute_plan(x, args->perm);
  return args;
}

}  // namespace qg
