// Learned weight ranges (QConfig::learned_weight_ranges): torchao's range learning
// (IntxFakeQuantizeConfig(range_learning=True)) on the dynamic symmetric weight recipes
// (8da4w, 8da3w, 8da2w, w8a8_dynamic). Semantics, as torchao defines them:
//   * Each weight quantizer's scales ([out, in / group] per group, [out] per channel) are a
//     trainable parameter "<layer>.weight_scale", f32 (f64 for f64 parameters). Symmetric
//     recipes learn no zero point: it is a constant 0.
//   * Initialisation: the dynamic recipe's qparams of the weights the model starts from
//     (dynamic_fake_quantize with dynamic_weight_attrs), floored at 1e-9 as torchao floors
//     them when it turns them into parameters. Hence the first step's forward equals the
//     dynamic recipe's bit for bit (whenever no group's scale is below 1e-9, i.e. a group
//     whose largest magnitude is under qmax * 1e-9).
//   * Forward: lsq_fake_quantize, y = (clamp(rint(w * (1 / s)), qmin, qmax)) * s.
//   * Gradients: plain autograd through a straight-through round, torchao's, which is
//     lsq_backward with grad_factor 1 (no LSQ gradient scaling): per element in range
//     dw = dy, ds += dy * (rint(v) - v); outside dw = 0, ds += dy * (qmin or qmax), summed
//     per group in f64 (torchao's autograd forms the same terms in the tensor's float type).
//   * The scales are updated by the model's optimizer like every other parameter (the same
//     learning rate and weight decay), as torchao's scales are by an optimizer over
//     model.parameters().
// docs/LLM_NUMERICS.md, "Learned ranges", has the reference.
#pragma once

#include <vector>

#include "nn/builder.h"
#include "runtime/executor.h"

namespace qg::nn {

// The initial learned scale of a weight `w` ([out, in], any float dtype, on any device) under
// `qc` (dynamic symmetric weights): dynamic_fake_quantize's scale with dynamic_weight_attrs
// (group size clamped to `in`, as Builder::weight does), at least 1e-9, in `dtype` (f32 or
// f64).
Tensor initial_weight_scale(const Tensor& w, const QConfig& qc, DType dtype);

// The learned scale parameters of `weights`, in order (none without learned ranges).
std::vector<ValueId> learned_scales(const std::vector<WeightQuantizer>& weights);

// Sets every learned scale of `weights` to initial_weight_scale of its weight's current value
// in `exec` (after weights were loaded from elsewhere: a fine-tune starts its ranges from the
// weights it fine-tunes, as torchao initialises them from the prepared model). A no-op
// without learned ranges. Throws qg::Error (op "nn.learned_ranges") when a weight is not a
// parameter.
void initialize_learned_ranges(Executor& exec, const std::vector<WeightQuantizer>& weights,
                               const QConfig& qc);

}  // namespace qg::nn
