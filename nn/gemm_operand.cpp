// The operand chain of a linear's input, shared by the linears that read the same value (Llama's
// q/k/v projections read one normed input, gate/up another): x -> flatten to [rows, in] ->
// gemm_input (one per-token dynamic_fake_quantize under dynamic activations) -> cast to the
// compute dtype (a 4-D input's per-tensor quantizer comes before the flatten).
//
// Why sharing the quantizer leaves forward and gradients bit for bit those of one chain per
// linear (GemmInputSharing::quantizer):
// - Forward: dynamic_fake_quantize is a deterministic function of x alone (per-token qparams
//   from each row's own range), so every copy computes the same bits; the reshape is a view.
// - Backward: with one chain per linear, x's gradient is the sum of the branches'
//   ste_backward(g_i, mask), where mask (the same for every branch: it depends on x only)
//   selects g_i or 0. Shared, it is ste_backward(sum of g_i, mask): the branches' gradients
//   (each cast back from the compute dtype by its own linear's cast, as before) meet in x's
//   dtype at the flatten output, then are masked once. Selecting by a 0/1 mask commutes with
//   the sum (masked rows are +0 either way), and autograd adds contributions in the order it
//   meets their readers walking the topological order backwards (autograd/grad.cpp), which
//   for the sharing linears is their build order in both graphs, so each float add sees the
//   same operands in the same order. tests/nn/gemm_input_sharing_test.cpp checks loss and
//   every parameter gradient bit for bit.
// Sharing the cast too (GemmInputSharing::with_cast) moves that sum before the cast back,
// into the compute dtype: a bf16 add rounds where the f32 adds did not, so gradients differ.
#include "core/error.h"
#include "nn/builder.h"

namespace qg::nn {

ValueId Builder::gemm_operand(ValueId x, const std::string& name) {
  const Shape xs = shape_of_value(g_, x);
  QG_CHECK(xs.size() >= 2 && xs.back() > 0, "nn.gemm_operand", "layer '", name,
           "' needs an input of rank >= 2 with a non-empty last axis, got ",
           g_.value(x).type.str());
  const int64_t in = xs.back(), rows = shape_numel(xs) / in;
  const DType dtype = g_.value(x).type.dtype;
  // Only chains that compute something are shared: a bare reshape costs nothing, and leaving
  // it per linear keeps models without dynamic activations (the digits models' static
  // recipes, float) exactly as they were.
  const bool casts = precision_.mixed() && dtype != precision_.compute;
  const bool share =
      sharing_ != GemmInputSharing::off &&
      (qc_.dynamic_activations() || (sharing_ == GemmInputSharing::with_cast && casts));
  const auto key = std::make_tuple(x, rows, dtype);
  if (share) {
    auto it = shared_operands_.find(key);
    if (it != shared_operands_.end()) return it->second;
  }
  // Inputs of rank > 2 ([N, T, D] tokens) run as one [N * T, D] GEMM. A per-token quantizer
  // (dynamic activations below rank 4) sees the same rows either way, so the flatten comes
  // first there: the quantizer's y is then read by the cast to the compute dtype alone, and
  // fuse_dfq_cast can write the narrow copy in the same pass. A 4-D input keeps its one
  // per-tensor range, taken before the flatten.
  const bool flatten_first = xs.size() > 2 && xs.size() != 4 && qc_.dynamic_activations();
  ValueId operand = x;
  if (flatten_first)
    operand = g_.apply1("reshape", {operand}, {{"shape", Shape{rows, in}}}, name + ".flatten");
  operand = gemm_input(operand, name + ".in");
  if (xs.size() > 2 && !flatten_first)
    operand = g_.apply1("reshape", {operand}, {{"shape", Shape{rows, in}}}, name + ".flatten");
  if (share) shared_operands_[key] = operand;
  return operand;
}

ValueId Builder::gemm_operand_to_compute(ValueId x, ValueId operand, const std::string& name) {
  const DType compute = precision_.compute;
  const bool share = sharing_ == GemmInputSharing::with_cast && precision_.mixed() &&
                     g_.value(operand).type.dtype != compute;
  const auto key = std::make_tuple(x, shape_of_value(g_, operand)[0], compute);
  if (share) {
    auto it = shared_operands_.find(key);
    if (it != shared_operands_.end()) return it->second;
  }
  ValueId out = to_compute(operand, name + ".in");
  if (share) shared_operands_[key] = out;
  return out;
}

}  // namespace qg::nn
