// The language-model QAT recipes (torchao's QAT numerics through dynamic_fake_quantize), their
// names, and QConfig::validate.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "nn/qconfig.h"

namespace qg::nn {
namespace {

// The group sizes torchao's int4 QAT quantizers take (its int4 weight-only one asserts them).
constexpr int kRecipeGroupSizes[] = {32, 64, 128, 256};

QConfig dynamic_group_weights(WeightQuant w, ActQuant a, int group_size) {
  QConfig q{w, a};
  q.weight_scope = "group";
  q.weight_group_size = group_size;
  q.dynamic_weights = true;
  return q;
}

}  // namespace

QConfig QConfig::int8_dyn_act_int4_weight(int group_size) {
  return int8_dyn_act_intx_weight(4, group_size);
}

QConfig QConfig::int8_dyn_act_intx_weight(int bits, int group_size) {
  QG_CHECK(bits == 2 || bits == 3 || bits == 4, "qconfig", "weight bits ", bits,
           " are outside the 8-bit dynamic activation recipes (8da4w, 8da3w, 8da2w): 2, 3 or 4");
  const WeightQuant w = bits == 4   ? WeightQuant::int4
                        : bits == 3 ? WeightQuant::int3
                                    : WeightQuant::int2;
  return dynamic_group_weights(w, ActQuant::int8_dynamic_token, group_size);
}

QConfig QConfig::int8_dyn_act_int8_weight() {
  QConfig q{WeightQuant::int8, ActQuant::int8_dynamic_token};
  q.weight_scope = "channel";
  q.dynamic_weights = true;
  return q;
}

QConfig QConfig::int4_weight_only(int group_size) {
  QConfig q = dynamic_group_weights(WeightQuant::int4, ActQuant::none, group_size);
  q.weight_mapping = WeightMapping::float_zero;
  return q;
}

void QConfig::validate() const {
  QG_CHECK(weight_scope == "channel" || weight_scope == "tensor" || weight_scope == "group",
           "qconfig", "weight scope '", weight_scope, "' is not one of channel, tensor, group");
  QG_CHECK(weight_group_size > 0 && nf4_group_size > 0, "qconfig", "group sizes ",
           weight_group_size, " (weights) and ", nf4_group_size, " (NF4) must be positive");
  const std::string w = weight_quant_name(weight);
  if (dynamic_weights && weight != WeightQuant::none) {
    QG_CHECK(weight != WeightQuant::nf4, "qconfig",
             "dynamic weights are integer codes; nf4 has its own quantizer");
    QG_CHECK(weight_scope != "tensor", "qconfig",
             "dynamic weights are per channel or per group (torchao's QAT), not per tensor");
  }
  QG_CHECK(embedding_weight == WeightQuant::none || embedding_weight == WeightQuant::int8 ||
               embedding_weight == WeightQuant::int4,
           "qconfig", "embedding weights ", weight_quant_name(embedding_weight),
           " are outside torchao's embedding QAT recipes: none (float), int8 or int4");
  QG_CHECK(embedding_group_size > 0, "qconfig", "embedding group size ", embedding_group_size,
           " must be positive");
  QG_CHECK(weight != WeightQuant::int3 || dynamic_weights, "qconfig",
           "int3 weights are a dynamic recipe (8da3w): set dynamic_weights");
  if (weight_mapping == WeightMapping::float_zero) {
    QG_CHECK(dynamic_weights && weight == WeightQuant::int4 && weight_scope == "group", "qconfig",
             "the float zero point (int4 weight-only) takes dynamic int4 weights per group, got ",
             w, " weights per ", weight_scope, dynamic_weights ? " (dynamic)" : " (observed)");
  }
  if (learned_weight_ranges) {
    QG_CHECK(dynamic_weights && weight != WeightQuant::none && weight != WeightQuant::nf4,
             "qconfig", "learned weight ranges start from dynamic integer weight qparams ",
             "(8da4w, 8da3w, 8da2w, w8a8_dynamic), got ", w, " weights",
             dynamic_weights ? " (dynamic)" : " (observed)");
    // int4 weight-only's zero point is a float value (tinygemm's, near the group's minimum);
    // torchao's range learning rounds and clamps every zero point into [qmin, qmax] when it
    // makes it a parameter, which throws that value away, and lsq_fake_quantize's zero point
    // is an integer code: no exact semantics to follow, so it is refused.
    QG_CHECK(weight_mapping == WeightMapping::symmetric, "qconfig",
             "learned weight ranges take symmetric weights (no zero point to learn); the float ",
             "zero point of int4 weight-only (float_zero) is not learnable");
  }
  if (integer_forward) {
    QG_CHECK(dynamic_activations() && dynamic_weights && weight != WeightQuant::none &&
                 weight != WeightQuant::nf4 && weight_mapping == WeightMapping::symmetric,
             "qconfig",
             "the integer forward multiplies per-token int8 activation codes by symmetric "
             "integer weight codes (8da4w, 8da3w, 8da2w, w8a8_dynamic), got ",
             gemm_str());
    QG_CHECK(!learned_weight_ranges, "qconfig",
             "the integer forward takes the dynamic weight qparams; learned ranges are not "
             "supported with it");
  }
}

WeightMapping parse_weight_mapping(const std::string& s) {
  if (s == "symmetric") return WeightMapping::symmetric;
  if (s == "float_zero") return WeightMapping::float_zero;
  QG_FAIL("qconfig", "weight mapping '", s, "' is not one of symmetric, float_zero");
}

std::string weight_mapping_name(WeightMapping m) {
  return m == WeightMapping::float_zero ? "float_zero" : "symmetric";
}

const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> names = {
      "float", "8da4w", "8da3w", "8da2w", "int4_weight_only", "w8a8_dynamic"};
  return names;
}

QConfig parse_recipe(const std::string& name, int group_size) {
  std::string known;
  for (const std::string& n : recipe_names()) known += (known.empty() ? "" : ", ") + n;
  QG_CHECK(std::find(recipe_names().begin(), recipe_names().end(), name) != recipe_names().end(),
           "qconfig", "recipe '", name, "' is not one of ", known);
  if (name == "float") return QConfig::float32();
  if (name == "w8a8_dynamic") return QConfig::int8_dyn_act_int8_weight();
  QG_CHECK(std::find(std::begin(kRecipeGroupSizes), std::end(kRecipeGroupSizes), group_size) !=
               std::end(kRecipeGroupSizes),
           "qconfig", "recipe '", name, "': group size ", group_size,
           " is not one of 32, 64, 128, 256");
  if (name == "int4_weight_only") return QConfig::int4_weight_only(group_size);
  return QConfig::int8_dyn_act_intx_weight(name[3] - '0', group_size);
}

Attrs dynamic_activation_attrs(const QConfig& qc) {
  QG_CHECK(qc.dynamic_activations(), "qconfig", qc.str(), " has no dynamic activations");
  return {{"group_size", 0},
          {"mode", std::string("asymmetric")},
          {"quant_min", -128},
          {"quant_max", 127},
          {"eps", static_cast<double>(std::numeric_limits<float>::epsilon())}};
}

Attrs dynamic_weight_attrs(const QConfig& qc, DType weight_dtype) {
  QG_CHECK(qc.dynamic_weights && qc.weight != WeightQuant::none, "qconfig", qc.str(),
           " has no dynamic weights");
  qc.validate();
  const int64_t bits = qc.weight_bits();
  const int64_t group = qc.weight_scope == "group" ? qc.weight_group_size : 0;
  if (qc.weight_mapping == WeightMapping::float_zero)
    return {{"group_size", group}, {"mode", std::string("float_zero")},
            {"quant_min", 0},      {"quant_max", (int64_t{1} << bits) - 1},
            {"eps", 1e-6},         {"qparam_dtype", std::string("bf16")}};
  double smallest_normal = std::numeric_limits<float>::min();  // f32 and bf16
  if (weight_dtype == DType::f16) smallest_normal = std::ldexp(1.0, -14);
  if (weight_dtype == DType::f64) smallest_normal = std::numeric_limits<double>::min();
  return {{"group_size", group},
          {"mode", std::string("symmetric")},
          {"quant_min", -(int64_t{1} << (bits - 1))},
          {"quant_max", (int64_t{1} << (bits - 1)) - 1},
          {"eps", smallest_normal}};
}

}  // namespace qg::nn
