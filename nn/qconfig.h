// QConfig: which fake-quantizers a model gets, following torch.ao.quantization (and torchao)
// conventions. Layers ask the Builder for "the weight quantizer" and "the activation
// quantizer"; only the QConfig knows what those are.
//   weights:     symmetric signed codes (-2^(b-1)..2^(b-1)-1, zero point 0) for b = 8, 4, 3
//                or 2, per output channel (axis 0 of the [out, in] weight, PyTorch's
//                default_per_channel_weight_fake_quant), per tensor, or per group of
//                `weight_group_size` inputs along each row (torchao's group-wise int4);
//                or NF4 codes per group of `nf4_group_size` weights. Their qparams come from
//                an observer's running range, or (`dynamic_weights`, torchao's QAT) from the
//                current weights on every step, in one dynamic_fake_quantize node; dynamic
//                int4 weights may instead be asymmetric unsigned codes 0..15 with a float
//                zero point (WeightMapping::float_zero: torchao's int4 weight-only QAT);
//   activations: static per-tensor affine uint8 (0..255) or uint4 (0..15) with a
//                moving-average (or min/max) observer on each layer's output (PyTorch's
//                default QAT activation fake-quant), or dynamic per-token asymmetric int8
//                (-128..127, qparams from each token's own min/max every step) on the input
//                of each GEMM (torchao's Int8DynActInt4Weight).
//
// PrecisionPolicy, beside it, says which float dtypes the model keeps and computes in.
#pragma once

#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/dtype.h"

namespace qg::nn {

enum class WeightQuant { none, int8, int4, int3, int2, nf4 };
// How dynamic weights map to codes: symmetric signed codes with zero point 0, or torchao's
// tinygemm format (unsigned codes, a float zero point, scale and zero rounded to bf16).
enum class WeightMapping { symmetric, float_zero };
enum class ActQuant { none, uint8, uint4, int8_dynamic_token };
enum class ObserverKind { minmax, moving_average };

struct QConfig {
  WeightQuant weight = WeightQuant::none;
  ActQuant activation = ActQuant::none;
  ObserverKind observer = ObserverKind::moving_average;
  std::string weight_scope = "channel";  // "channel" (per output row), "tensor" or "group"
  int weight_group_size = 32;            // scope "group": inputs per qparam along each row
  double averaging_constant = 0.01;      // moving-average activation observers (PyTorch)
  // Moving-average weight observers. 0.01 is PyTorch's default; 1.0 makes the qparams
  // follow the current weights every step (torchao's QAT fake-quant of weights).
  double weight_averaging_constant = 0.01;
  int nf4_group_size = 64;  // NF4: weights per absmax block
  // Weight qparams from the current weights on every call (dynamic_fake_quantize: torchao's
  // QAT weight fake-quant, no observer state) instead of an observer.
  bool dynamic_weights = false;
  WeightMapping weight_mapping = WeightMapping::symmetric;  // dynamic weights only
  // The Llama token embedding's table (nn/llama_embedding.h): float (none), or torchao's
  // embedding QAT, int8 or int4 (IntxFakeQuantizeConfig weight-only, as
  // Int4WeightOnlyEmbeddingQATQuantizer builds it): symmetric signed codes per group of
  // `embedding_group_size` along the hidden dim, qparams from the current table every step.
  WeightQuant embedding_weight = WeightQuant::none;
  int embedding_group_size = 32;
  // Learned ranges (torchao's IntxFakeQuantizeConfig(range_learning=True)) on dynamic
  // symmetric weights: each weight quantizer's scales become a trainable parameter
  // "<layer>.weight_scale" ([out, in / group] or [out]) initialised to the dynamic qparams of
  // the initial weights, and the quantizer is lsq_fake_quantize (nn/learned_ranges.h).
  bool learned_weight_ranges = false;
  // The integer forward: each linear's forward GEMM is int8_matmul_ste, the deployed integer
  // arithmetic (exact int32 dots of the per-token int8 activation codes and the weight codes,
  // the scales applied per group; ops/int8_matmul), with the float GEMM's STE backward through
  // the fake-quantized operands. The converted model runs the same op, so QAT logits equal the
  // deployed ones bit for bit on every backend. Takes dynamic activations and dynamic symmetric
  // integer weights per channel or per group (8da4w, 8da3w, 8da2w, w8a8_dynamic).
  bool integer_forward = false;

  static QConfig float32() { return {}; }
  static QConfig w8a8() { return {WeightQuant::int8, ActQuant::uint8}; }
  static QConfig w4a8() { return {WeightQuant::int4, ActQuant::uint8}; }
  static QConfig nf4a8() { return {WeightQuant::nf4, ActQuant::uint8}; }
  // The low-bit settings where post-training quantization visibly fails.
  static QConfig w4a4() { return {WeightQuant::int4, ActQuant::uint4}; }
  static QConfig w2a8() { return {WeightQuant::int2, ActQuant::uint8}; }
  // Group-wise int4 weights (group_size inputs per scale), static uint8 activations.
  static QConfig w4a8_group(int group_size = 32);
  // The language-model recipes, torchao's QAT numerics bit for bit (dynamic_fake_quantize):
  // torchao Int8DynActInt4WeightQATQuantizer (8da4w): per-token dynamic asymmetric int8
  // activations on GEMM inputs (f32 epsilon as the scale floor), group-wise symmetric int4
  // weights whose qparams come from the current weights (the floor: the weight dtype's
  // smallest normal).
  static QConfig int8_dyn_act_int4_weight(int group_size = 32);
  // 8da4w's activations with symmetric int8 weights per output channel (torchao's
  // IntxFakeQuantizeConfig(torch.int8, "per_channel")): w8a8 dynamic.
  static QConfig int8_dyn_act_int8_weight();
  // torchao Int4WeightOnlyQATQuantizer: asymmetric uint4 weights per group with a float zero
  // point, scale and zero in bf16 (tinygemm's format), eps 1e-6; activations stay float.
  static QConfig int4_weight_only(int group_size = 128);
  // 8da4w's activations with symmetric `bits`-bit weights per group (bits 2, 3 or 4):
  // torchao's IntxFakeQuantizeConfig(torch.int{bits}, group_size=g) weights (f32 scale
  // precision, its default). QATConfig(Int8DynamicActivationIntxWeightConfig(torch.int{bits},
  // PerGroup(g))) builds the same weight config but leaves the scale dtype, and the activation
  // eps, to the tensor's dtype: equal to this recipe for f32 tensors only. Throws qg::Error for
  // other bit widths.
  static QConfig int8_dyn_act_intx_weight(int bits, int group_size = 32);

  bool quantized() const { return weight != WeightQuant::none || activation != ActQuant::none; }
  bool static_activations() const {
    return activation == ActQuant::uint8 || activation == ActQuant::uint4;
  }
  bool dynamic_activations() const { return activation == ActQuant::int8_dynamic_token; }
  int weight_bits() const;      // 32 for float weights
  int activation_bits() const;  // 32 for float activations
  bool embedding_quantized() const { return embedding_weight != WeightQuant::none; }
  // "W8A8 (weights per channel, moving_average observers)"; a quantized embedding appends
  // " + embedding int4 per group of 32" (so checkpoints of another embedding recipe differ).
  std::string str() const;
  std::string gemm_str() const;  // str() without the embedding part
  // Throws qg::Error (op "qconfig") for a combination no quantizer implements: dynamic
  // weights that are float or NF4 or per tensor, a float zero point on other than dynamic
  // int4 group-wise weights, int3 weights from an observer, a group size below 1, embedding
  // codes other than int8 or int4, learned ranges on other than dynamic symmetric integer
  // weights.
  void validate() const;
};

// The language-model recipes by name, with the group size of their group-wise weights (one
// of 32, 64, 128, 256, as torchao's int4 QAT takes them; ignored by w8a8_dynamic):
//   "8da4w", "8da3w", "8da2w"  int8_dyn_act_intx_weight(4, 3 or 2, group_size)
//   "int4_weight_only"         int4_weight_only(group_size)
//   "w8a8_dynamic"             int8_dyn_act_int8_weight()
//   "float"                    float32()
// Throws qg::Error naming the recipe and the value for an unknown name or group size.
QConfig parse_recipe(const std::string& name, int group_size);
const std::vector<std::string>& recipe_names();

// The dynamic_fake_quantize attributes of a QConfig's dynamic quantizers (what the Builder
// puts in the graph, and what the torchao conformance test runs):
//   activations: per token, asymmetric [-128, 127], eps = f32's epsilon (torchao's 8da4w);
//   weights of dtype `weight_dtype` (the [out, in] matrix the quantizer reads): symmetric
//   [-2^(b-1), 2^(b-1) - 1] per group (or per row for scope channel), eps = the dtype's
//   smallest normal; or float_zero [0, 2^b - 1] per group, eps 1e-6, bf16 qparams.
Attrs dynamic_activation_attrs(const QConfig& qc);
Attrs dynamic_weight_attrs(const QConfig& qc, DType weight_dtype);

// Which float dtypes a model uses, like torch.autocast over f32 master weights (and Lightning's
// "bf16-mixed" precision setting):
//   parameter:  the dtype parameters are stored and updated in (the optimizer's dtype);
//   compute:    the dtype GEMM operands are cast to (the Builder inserts `cast` nodes when it
//               differs from `parameter`; their gradients are cast back);
//   accumulate: the dtype sums and GEMM accumulators run in. The kernels already widen
//               f16/bf16 to f32 and f64 stays f64, so it only records (and validates) that.
// The default (f32 everywhere) adds no node, so graphs are what they were without a policy.
struct PrecisionPolicy {
  DType parameter = DType::f32;
  DType compute = DType::f32;
  DType accumulate = DType::f32;

  static PrecisionPolicy f32() { return {}; }
  // f32 parameters, bf16 (or f16) GEMM operands, f32 accumulation.
  static PrecisionPolicy bf16_mixed() { return {DType::f32, DType::bf16, DType::f32}; }
  static PrecisionPolicy f16_mixed() { return {DType::f32, DType::f16, DType::f32}; }

  bool mixed() const { return compute != parameter; }
  // Throws qg::Error naming the field and value: parameter and compute must be f32, f64, f16
  // or bf16, accumulate f32 or f64 and at least as wide as compute.
  void validate() const;
  // The name parse_precision reads back: "f32", "bf16-mixed", or "PARAM/COMPUTE/ACCUMULATE"
  // ("f32/bf16/f64") when no preset matches.
  std::string name() const;
  // "bf16-mixed (parameters f32, compute bf16, accumulate f32)".
  std::string str() const;
  bool operator==(const PrecisionPolicy& o) const {
    return parameter == o.parameter && compute == o.compute && accumulate == o.accumulate;
  }
};

// "f32", "f64", "bf16", "f16" (one dtype throughout, accumulating in f32 or f64),
// "bf16-mixed", "f16-mixed", or "PARAM/COMPUTE/ACCUMULATE"; the result is validated.
PrecisionPolicy parse_precision(const std::string& s);

WeightQuant parse_weight_quant(const std::string& s);      // "32", "8", "4", "3", "2", "nf4"
ActQuant parse_act_quant(const std::string& s);            // "32", "8", "4", "dyn8"
ObserverKind parse_observer(const std::string& s);         // "minmax", "moving_average"
WeightMapping parse_weight_mapping(const std::string& s);  // "symmetric", "float_zero"
std::string weight_mapping_name(WeightMapping m);          // parse_weight_mapping reads it back
std::string weight_quant_name(WeightQuant w);              // parse_weight_quant reads it back
std::string act_quant_name(ActQuant a);                    // parse_act_quant reads it back

}  // namespace qg::nn
