#include "nn/qconfig.h"

#include "core/error.h"

namespace qg::nn {

int QConfig::weight_bits() const {
  switch (weight) {
    case WeightQuant::int8:
      return 8;
    case WeightQuant::int4:
    case WeightQuant::nf4:
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
    case WeightQuant::nf4:
      return "nf4";
    default:
      return "f32";
  }
}

std::string QConfig::str() const {
  if (!quantized()) return "float32";
  std::string w = weight == WeightQuant::nf4 ? "NF4" : "W" + std::to_string(weight_bits());
  std::string a = activation == ActQuant::uint8 ? "A8" : "A32";
  return w + a + " (weights per " + weight_scope + ", " +
         (observer == ObserverKind::minmax ? "minmax" : "moving_average") + " observers)";
}

WeightQuant parse_weight_quant(const std::string& s) {
  if (s == "32" || s == "f32" || s == "float") return WeightQuant::none;
  if (s == "8" || s == "int8") return WeightQuant::int8;
  if (s == "4" || s == "int4") return WeightQuant::int4;
  if (s == "nf4") return WeightQuant::nf4;
  QG_FAIL("qconfig", "weight bits '", s, "' is not one of 32, 8, 4, nf4");
}

ActQuant parse_act_quant(const std::string& s) {
  if (s == "32" || s == "f32" || s == "float") return ActQuant::none;
  if (s == "8" || s == "uint8") return ActQuant::uint8;
  QG_FAIL("qconfig", "activation bits '", s, "' is not one of 32, 8");
}

ObserverKind parse_observer(const std::string& s) {
  if (s == "minmax") return ObserverKind::minmax;
  if (s == "moving_average" || s == "ema") return ObserverKind::moving_average;
  QG_FAIL("qconfig", "observer '", s, "' is not one of minmax, moving_average");
}

}  // namespace qg::nn
