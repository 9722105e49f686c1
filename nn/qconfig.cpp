#include "nn/qconfig.h"

#include <vector>

#include "core/error.h"

namespace qg::nn {

QConfig QConfig::w4a8_group(int group_size) {
  QConfig q = w4a8();
  q.weight_scope = "group";
  q.weight_group_size = group_size;
  return q;
}

int QConfig::weight_bits() const {
  switch (weight) {
    case WeightQuant::int8:
      return 8;
    case WeightQuant::int4:
    case WeightQuant::nf4:
      return 4;
    case WeightQuant::int3:
      return 3;
    case WeightQuant::int2:
      return 2;
    default:
      return 32;
  }
}

int QConfig::activation_bits() const {
  switch (activation) {
    case ActQuant::uint8:
    case ActQuant::int8_dynamic_token:
      return 8;
    case ActQuant::uint4:
      return 4;
    default:
      return 32;
  }
}

std::string weight_quant_name(WeightQuant w) {
  switch (w) {
    case WeightQuant::int8:
      return "int8";
    case WeightQuant::int4:
      return "int4";
    case WeightQuant::int3:
      return "int3";
    case WeightQuant::int2:
      return "int2";
    case WeightQuant::nf4:
      return "nf4";
    default:
      return "f32";
  }
}

std::string act_quant_name(ActQuant a) {
  switch (a) {
    case ActQuant::uint8:
      return "uint8";
    case ActQuant::uint4:
      return "uint4";
    case ActQuant::int8_dynamic_token:
      return "int8_dynamic_token";
    default:
      return "f32";
  }
}

std::string QConfig::str() const {
  if (!embedding_quantized()) return gemm_str();
  return gemm_str() + " + embedding " + weight_quant_name(embedding_weight) + " per group of " +
         std::to_string(embedding_group_size);
}

std::string QConfig::gemm_str() const {
  if (!quantized()) return "float32";
  std::string w = weight == WeightQuant::nf4 ? "NF4" : "W" + std::to_string(weight_bits());
  std::string a = dynamic_activations() ? "A8dyn" : "A" + std::to_string(activation_bits());
  std::string scope = weight_scope;
  if (weight_scope == "group") scope += " of " + std::to_string(weight_group_size);
  const bool dynamic = dynamic_weights && weight != WeightQuant::none;
  std::string how = "weights per " + scope;
  if (dynamic)
    how += learned_weight_ranges                         ? ", learned ranges"
           : weight_mapping == WeightMapping::float_zero ? ", dynamic, float zero"
                                                         : ", dynamic";
  if (integer_forward) how += ", integer forward";
  if (!dynamic || static_activations())
    how += std::string(", ") + (observer == ObserverKind::minmax ? "minmax" : "moving_average") +
           " observers";
  return w + a + " (" + how + ")";
}

WeightQuant parse_weight_quant(const std::string& s) {
  if (s == "32" || s == "f32" || s == "float") return WeightQuant::none;
  if (s == "8" || s == "int8") return WeightQuant::int8;
  if (s == "4" || s == "int4") return WeightQuant::int4;
  if (s == "3" || s == "int3") return WeightQuant::int3;
  if (s == "2" || s == "int2") return WeightQuant::int2;
  if (s == "nf4") return WeightQuant::nf4;
  QG_FAIL("qconfig", "weight bits '", s, "' is not one of 32, 8, 4, 3, 2, nf4");
}

ActQuant parse_act_quant(const std::string& s) {
  if (s == "32" || s == "f32" || s == "float") return ActQuant::none;
  if (s == "8" || s == "uint8") return ActQuant::uint8;
  if (s == "4" || s == "uint4") return ActQuant::uint4;
  if (s == "dyn8" || s == "int8_dynamic_token") return ActQuant::int8_dynamic_token;
  QG_FAIL("qconfig", "activation bits '", s, "' is not one of 32, 8, 4, dyn8");
}

ObserverKind parse_observer(const std::string& s) {
  if (s == "minmax") return ObserverKind::minmax;
  if (s == "moving_average" || s == "ema") return ObserverKind::moving_average;
  QG_FAIL("qconfig", "observer '", s, "' is not one of minmax, moving_average");
}

namespace {

bool is_one_of(DType d, const std::vector<DType>& set) {
  for (DType e : set)
    if (d == e) return true;
  return false;
}

// Named presets, in the order name() prefers them.
struct PrecisionPreset {
  const char* name;
  PrecisionPolicy policy;
};
const std::vector<PrecisionPreset>& precision_presets() {
  static const std::vector<PrecisionPreset> presets = {
      {"f32", PrecisionPolicy::f32()},
      {"f64", {DType::f64, DType::f64, DType::f64}},
      {"bf16", {DType::bf16, DType::bf16, DType::f32}},
      {"f16", {DType::f16, DType::f16, DType::f32}},
      {"bf16-mixed", PrecisionPolicy::bf16_mixed()},
      {"f16-mixed", PrecisionPolicy::f16_mixed()},
  };
  return presets;
}

}  // namespace

void PrecisionPolicy::validate() const {
  for (auto [field, d] : {std::pair<const char*, DType>{"parameter", parameter},
                          std::pair<const char*, DType>{"compute", compute}})
    QG_CHECK(is_one_of(d, kFloatDTypes), "precision", field, " dtype ", dtype_name(d),
             " is not one of f32, f64, f16, bf16");
  QG_CHECK(is_one_of(accumulate, kF32F64DTypes), "precision", "accumulate dtype ",
           dtype_name(accumulate), " is not one of f32, f64");
  QG_CHECK(!(compute == DType::f64 && accumulate != DType::f64), "precision", "accumulate dtype ",
           dtype_name(accumulate), " is narrower than compute dtype f64");
}

std::string PrecisionPolicy::name() const {
  for (const PrecisionPreset& p : precision_presets())
    if (p.policy == *this) return p.name;
  return std::string(dtype_name(parameter)) + "/" + dtype_name(compute) + "/" +
         dtype_name(accumulate);
}

std::string PrecisionPolicy::str() const {
  return name() + " (parameters " + dtype_name(parameter) + ", compute " + dtype_name(compute) +
         ", accumulate " + dtype_name(accumulate) + ")";
}

PrecisionPolicy parse_precision(const std::string& s) {
  for (const PrecisionPreset& p : precision_presets())
    if (s == p.name) return p.policy;
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t slash; (slash = s.find('/', start)) != std::string::npos; start = slash + 1)
    parts.push_back(s.substr(start, slash - start));
  parts.push_back(s.substr(start));
  std::string presets;
  for (const PrecisionPreset& p : precision_presets())
    presets += std::string(presets.empty() ? "" : ", ") + p.name;
  QG_CHECK(parts.size() == 3, "precision", "'", s, "' is not one of ", presets,
           " or PARAM/COMPUTE/ACCUMULATE (for example f32/bf16/f32)");
  PrecisionPolicy p;
  try {
    p = {dtype_from_name(parts[0]), dtype_from_name(parts[1]), dtype_from_name(parts[2])};
  } catch (const Error& e) {
    QG_FAIL("precision", "'", s, "': ", e.message());
  }
  p.validate();
  return p;
}

}  // namespace qg::nn
