// The crosscheck cases and comparison rules that the op definitions carry (OpDef::crosscheck):
// pinned so that no case goes missing and no output's comparison is loosened unnoticed.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/op_registry.h"
#include "runtime/crosscheck.h"

namespace qg {
namespace {

TEST(CrosscheckSpec, EveryOpKeepsItsCases) {
  const std::map<std::string, size_t> expected = {{"fake_quantize", 10},
                                                  {"minmax_observer", 12},
                                                  {"moving_average_observer", 12},
                                                  {"percentile_observer", 9},
                                                  {"histogram_observer", 7},
                                                  {"ste_backward_exact", 2},
                                                  {"nf4_quantize_pack", 4},
                                                  {"nf4_unpack_dequantize", 2},
                                                  {"nf4_double_quantize", 1},
                                                  {"nf4_double_dequantize", 1},
                                                  {"add", 1},
                                                  {"mul", 1},
                                                  {"sub", 1},
                                                  {"relu", 2},
                                                  {"sum", 2},
                                                  {"mean", 2},
                                                  {"matmul", 2},
                                                  {"softmax_cross_entropy", 3},
                                                  {"dynamic_range_quantize", 6},
                                                  {"int4_quantize_pack", 4},
                                                  {"int4_unpack_dequantize", 2},
                                                  {"quantize", 2},
                                                  {"max_pool2d", 2},
                                                  {"avg_pool2d", 1},
                                                  {"global_avg_pool2d", 1},
                                                  {"gelu", 3},
                                                  {"silu", 1},
                                                  {"dropout", 1},
                                                  {"conv_bn_fold_weight", 4},
                                                  {"cast", 8}};
  std::map<std::string, size_t> found;
  for (const OpDef* op : OpRegistry::instance().all()) {
    if (!op->crosscheck.cases) continue;
    const std::vector<CrosscheckCase> cases = op->crosscheck.cases();
    found[op->name] = cases.size();
    std::set<std::string> labels;
    for (const CrosscheckCase& c : cases) {
      EXPECT_TRUE(labels.insert(c.label).second) << op->name << ": two cases '" << c.label << "'";
      EXPECT_LE(c.inputs.size(), op->inputs.size()) << op->name << ": " << c.label;
    }
  }
  // The families listed above are pinned here; a family added since pins its own count in
  // its test folder (tests/ops_<family>), so adding a family touches its folders and the op
  // table's row only. Every op pinned here must still have exactly its cases.
  for (const auto& [op, count] : expected) EXPECT_EQ(found[op], count) << op;
  for (const auto& [op, count] : found) EXPECT_GT(count, 0u) << op;
}

// Every output compared to rounding, with the relative tolerance of its dtype; every other
// output of every op is compared bit for bit.
TEST(CrosscheckSpec, RoundedOutputsArePinned) {
  const std::set<std::pair<std::string, int>> rounded = {
      {"matmul", -1},
      {"sum", -1},
      {"mean", -1},
      {"sum_to", -1},
      {"softmax_cross_entropy", -1},
      {"softmax_cross_entropy_backward", -1},
      {"lsq_backward", 1},
      {"lsq_backward", 2},
      {"dequantize_backward", 1},
      {"batch_norm", -1},
      {"batch_norm_backward", -1},
      {"layer_norm", -1},
      {"layer_norm_backward", -1},
      {"rope", -1},
      {"causal_attention", -1},
      {"causal_attention_backward", -1},
      {"channel_div_backward", 1},
      {"fused_channel_div_batch_norm", -1},
      {"fused_channel_div_batch_norm_backward", -1},
      {"gelu", -1},
      {"gelu_backward", -1},
      {"silu", -1},
      {"silu_backward", -1},
      {"softmax", -1},
      {"softmax_backward", -1},
      {"fused_scaled_softmax", -1},
      {"fused_scaled_softmax_backward", -1},
      {"batched_matmul", -1},
      {"conv2d", -1},
      {"conv2d_backward_input", -1},
      {"conv2d_backward_weight", -1},
      {"conv2d_backward_bias", -1}};
  const std::map<DType, double> tolerance = {{DType::f32, 1e-5},
                                             {DType::f64, 1e-5},
                                             {DType::f16, 2.0 * 0.00048828125},
                                             {DType::bf16, 2.0 * 0.00390625}};
  for (const auto& [op, output] : rounded)
    ASSERT_NE(OpRegistry::instance().find(op), nullptr) << op;
  for (const OpDef* op : OpRegistry::instance().all())
    for (int output = 0; output < static_cast<int>(op->outputs.size()); ++output) {
      const bool is_rounded = rounded.count({op->name, -1}) || rounded.count({op->name, output});
      for (const auto& [dtype, tol] : tolerance) {
        const CompareRule rule = compare_rule(op->name, output, dtype);
        EXPECT_EQ(rule.exact, !is_rounded) << op->name << " output " << output;
        if (is_rounded) EXPECT_EQ(rule.tolerance, tol) << op->name << " " << dtype_name(dtype);
      }
    }
}

}  // namespace
}  // namespace qg
