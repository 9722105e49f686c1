// QConfig: which fake-quantizers a model gets, following torch.ao.quantization conventions.
//   weights:     per-channel (axis 0 of a [out, in] weight) symmetric signed int8
//                (-128..127, PyTorch's default_per_channel_weight_fake_quant) or int4
//                (-8..7), or NF4 codes per group of `nf4_group_size` weights;
//   activations: per-tensor affine quint8 (0..255) with a moving-average (or min/max)
//                observer, as PyTorch's default QAT activation fake-quant.
#pragma once

#include <string>

namespace qg::nn {

enum class WeightQuant { none, int8, int4, nf4 };
enum class ActQuant { none, uint8 };
enum class ObserverKind { minmax, moving_average };

struct QConfig {
  WeightQuant weight = WeightQuant::none;
  ActQuant activation = ActQuant::none;
  ObserverKind observer = ObserverKind::moving_average;
  std::string weight_scope = "channel";  // "channel" (per output row) or "tensor"
  double averaging_constant = 0.01;      // moving-average observers (PyTorch default)
  int nf4_group_size = 64;               // NF4: weights per absmax block

  static QConfig float32() { return {}; }
  static QConfig w8a8() { return {WeightQuant::int8, ActQuant::uint8}; }
  static QConfig w4a8() { return {WeightQuant::int4, ActQuant::uint8}; }
  static QConfig nf4a8() { return {WeightQuant::nf4, ActQuant::uint8}; }

  bool quantized() const { return weight != WeightQuant::none || activation != ActQuant::none; }
  int weight_bits() const;  // 32 for float weights
  std::string str() const;  // "W8A8 (channel, moving_average)"
};

WeightQuant parse_weight_quant(const std::string& s);  // "32", "8", "4", "nf4"
ActQuant parse_act_quant(const std::string& s);        // "32", "8"
ObserverKind parse_observer(const std::string& s);     // "minmax", "moving_average"
std::string weight_quant_name(WeightQuant w);

}  // namespace qg::nn
