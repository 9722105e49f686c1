#include "nn/qconfig.h"

#include "core/error.h"

namespace qg::nn {

QConfig QConfig::w4a8_group(int group_size) {
  QConfig q = w4a8();
  q.weight_scope = "group";
  q.weight_group_size = group_size;
  return q;
}

QConfig QConfig::int8_dyn_act_int4_weight(int group_size) {
  QConfig q{WeightQuant::int4, ActQuant::int8_dynamic_token};
  q.weight_scope = "group";
  q.weight_group_size = group_size;
  q.weight_averaging_constant = 1.0;
  return q;
}

int QConfig::weight_bits() const {
  switch (weight) {
    case WeightQuant::int8:
      return 8;
    case WeightQuant::int4:
    case WeightQuant::nf4:
      return 4;
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
  if (!quantized()) return "float32";
  std::string w = weight == WeightQuant::nf4 ? "NF4" : "W" + std::to_string(weight_bits());
  std::string a = dynamic_activations() ? "A8dyn" : "A" + std::to_string(activation_bits());
  std::string scope = weight_scope;
  if (weight_scope == "group") scope += " of " + std::to_string(weight_group_size);
  return w + a + " (weights per " + scope + ", " +
         (observer == ObserverKind::minmax ? "minmax" : "moving_average") + " observers)";
}

WeightQuant parse_weight_quant(const std::string& s) {
  if (s == "32" || s == "f32" || s == "float") return WeightQuant::none;
  if (s == "8" || s == "int8") return WeightQuant::int8;
  if (s == "4" || s == "int4") return WeightQuant::int4;
  if (s == "2" || s == "int2") return WeightQuant::int2;
  if (s == "nf4") return WeightQuant::nf4;
  QG_FAIL("qconfig", "weight bits '", s, "' is not one of 32, 8, 4, 2, nf4");
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

}  // namespace qg::nn
