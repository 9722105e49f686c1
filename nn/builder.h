// The layer-building context on top of core::Graph. A Builder holds the graph, the QConfig,
// the PrecisionPolicy and the seeded init stream; each layer kind lives in its own file
// (nn/linear.cpp, nn/conv2d.cpp, nn/conv_bn.cpp, nn/layer_norm.cpp, nn/rms_norm.cpp,
// nn/rotary.cpp, nn/attention.cpp, nn/causal_attention.cpp, nn/swiglu_mlp.cpp,
// nn/transformer_block.cpp, nn/embedding.cpp, nn/pooling.cpp) as a Builder method that
// creates its parameters and buffers under "<layer name>.<tensor>" (for example
// "block0.attn.q.weight"), appends its part of the graph, and records what conversion to
// integer weights needs. Layers never branch on bit widths: they ask for
//   weight(w)       the QConfig's weight quantizer on a [out, in] (or [out, in, kh, kw]) weight,
//   act(x)          the static activation quantizer of a layer's output,
//   gemm_input(x)   the dynamic activation quantizer of a GEMM's input,
// and each is the identity when the QConfig has no such quantizer. Parameters are created in
// the policy's parameter dtype; under a mixed policy (compute != parameter) linear layers cast
// their input, weight and bias to the compute dtype after the quantizers (torch.autocast's
// place for the cast), so the quantizers see the f32 master weights.
//
//   Graph g;
//   nn::Builder b(g, nn::QConfig::w8a8(), /*seed=*/1);
//   ValueId x = g.input("x", {DType::f32, {64, 64}});
//   ValueId h = b.linear(b.quant_input(x), 128, "fc1", /*relu=*/true, /*quantize_output=*/true);
//   ValueId logits = b.linear(h, 10, "fc2", false, true);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/graph.h"
#include "nn/qconfig.h"
#include "nn/rng.h"

namespace qg::nn {

// What the integer-weight conversion (nn/convert.h) and QuantizedMlp need about one Linear.
struct LinearLayer {
  std::string name;
  int64_t in_features = 0, out_features = 0;
  ValueId weight = kNoValue, bias = kNoValue;  // parameters: [out, in] and [out]
  NodeId weight_observer = -1;                 // -1 for float, NF4 or dynamic weights
  NodeId output_observer = -1;                 // activation observer after this layer
  bool relu = false;
};

// One weight quantizer: the float [out, in] matrix it reads (a parameter, or a folded
// conv-bn weight), its fake-quantized output, and where its qparams come from.
struct WeightQuantizer {
  std::string layer;
  ValueId source = kNoValue;     // f32 [out, in]
  ValueId quantized = kNoValue;  // f32 [out, in]: what the layer computes with
  // int8/int4/int3/int2: the node producing (scale, zero_point) as its outputs qparam_output
  // and qparam_output + 1: an observer (0), or dynamic weights' dynamic_fake_quantize (2).
  NodeId observer = -1;
  int qparam_output = 0;
  NodeId nf4_pack = -1;  // NF4: the nf4_quantize_pack node (packed codes, absmax)
  // Learned ranges (QConfig::learned_weight_ranges): the trainable scale parameter the
  // lsq_fake_quantize node reads (observer is then -1, the zero point a constant 0).
  ValueId learned_scale = kNoValue;
  // The integer forward (QConfig::integer_forward): the layer's int8_matmul_ste node, whose
  // inputs 5 and 6 are the weight codes (a quantize of `source`) and their scales. Conversion
  // replaces it by int8_matmul on constant codes.
  NodeId integer_gemm = -1;
};

// A conv + batch-norm pair folded for QAT (nn/conv_bn.cpp). Conversion replaces the batch
// norm by a per-channel bias: y = conv(x, W_fold) + beta - running_mean * gamma / std.
struct ConvBnLayer {
  std::string name;
  ValueId conv = kNoValue;    // conv2d(x, fq(W_fold)) before dividing by the scale factor
  ValueId bn_out = kNoValue;  // batch_norm's y
  NodeId bn_node = -1;
  NodeId fold_node = -1;  // conv_bn_fold_weight {w, gamma, running_var} (folded blocks only)
  ValueId gamma = kNoValue, beta = kNoValue, running_mean = kNoValue, running_var = kNoValue;
  double eps = 1e-5;
  bool folded = true;  // false with float weights: conv -> batch_norm, nothing folded
};

// Which part of a GEMM's input chain (gemm_input -> flatten -> cast to the compute dtype)
// linears reading the same value share (Builder::gemm_operand):
//   off         every linear builds its own chain.
//   quantizer   one gemm_input + flatten per source value where gemm_input adds a node (dynamic
//               activations); each linear keeps its own cast. Forward and gradients are bit
//               for bit those of `off`: see nn/gemm_operand.cpp.
//   with_cast   the cast as well. The forward is bit for bit `off`'s, but under a mixed policy
//               the branches' gradients meet in the compute dtype (bf16 adds) instead of the
//               parameter dtype, so gradients round differently from `off` (and from
//               torch.autocast, which casts once per Linear).
enum class GemmInputSharing { off, quantizer, with_cast };

class Builder {
 public:
  // Throws qg::Error when the QConfig or the PrecisionPolicy is invalid.
  Builder(Graph& graph, QConfig qconfig, uint64_t seed, PrecisionPolicy precision = {});

  // --- quantizers (nn/builder.cpp) ---
  // Static activation fake-quant of a graph input (PyTorch's QuantStub under QAT).
  ValueId quant_input(ValueId x, const std::string& name = "input");
  // The static activation quantizer (observer -> fake_quantize) of a layer output; identity
  // without static activation quantization. `observer` (optional) receives the observer.
  ValueId act(ValueId x, const std::string& name, NodeId* observer = nullptr);
  // The dynamic per-token activation quantizer of a GEMM input (one dynamic_fake_quantize
  // node, dynamic_activation_attrs); identity otherwise.
  ValueId gemm_input(ValueId x, const std::string& name);
  // The operand a linear named `name` reads for x (rank >= 2, in = its last axis), in two
  // steps so that a linear's nodes keep their order (operand, weight quantizer, casts):
  //   gemm_operand             gemm_input(x, name + ".in"), reshaped to [rows, in]
  //                            ("<name>.flatten") when x has rank > 2;
  //   gemm_operand_to_compute  that operand cast to the compute dtype ("<name>.in.to_compute").
  // Under the sharing mode (gemm_input_sharing) a later linear reading the same x reuses the
  // first one's nodes, which keep the first linear's names (nn/gemm_operand.cpp).
  ValueId gemm_operand(ValueId x, const std::string& name);
  ValueId gemm_operand_to_compute(ValueId x, ValueId operand, const std::string& name);
  GemmInputSharing gemm_input_sharing() const { return sharing_; }
  void set_gemm_input_sharing(GemmInputSharing sharing) { sharing_ = sharing; }
  // The weight quantizer on w ([out, in...]; inputs beyond axis 0 are flattened for the
  // qparams): observer -> fake_quantize, or one dynamic_fake_quantize node for dynamic
  // weights (dynamic_weight_attrs); records a WeightQuantizer for conversion. Dynamic
  // weights narrower than one group get one group per row (torchao's qparam functions clamp
  // the group size so); otherwise a group size that does not divide the inputs throws
  // qg::Error naming the layer.
  ValueId weight(ValueId w, const std::string& layer);
  // v in the compute dtype: a `cast` node under a mixed policy when v's dtype differs from
  // it, v itself otherwise (so the default policy adds no node).
  ValueId to_compute(ValueId v, const std::string& name);
  // v cast to the parameter dtype when it is in another float dtype (a mixed-precision
  // GEMM's output joining the residual stream, which stays in the parameter dtype as under
  // torch.autocast); v itself otherwise.
  ValueId to_parameter(ValueId v, const std::string& name);

  // --- layers (one file each) ---
  // y = x W^T + b over the last axis of x (nn/linear.cpp). With `relu` the ReLU is fused
  // before the output activation quantizer; `quantize_output` adds that quantizer. Without
  // `bias` the layer has no "<name>.bias" (Llama's projections) and LinearLayer::bias is
  // kNoValue.
  ValueId linear(ValueId x, int64_t out_features, const std::string& name, bool relu,
                 bool quantize_output, bool bias = true);
  // conv2d with bias, weight quantizer, optional fused ReLU and output quantizer
  // (nn/conv2d.cpp). x is [N, C, H, W] and C must equal in_channels (as torch's
  // Conv2d(in_channels, out_channels, kernel) declares it).
  ValueId conv2d(ValueId x, int64_t in_channels, int64_t out_channels, int64_t kernel,
                 const std::string& name, int64_t stride = 1, int64_t padding = 0,
                 bool relu = false, bool quantize_output = true);
  // Conv2d + BatchNorm2d (+ ReLU) folded for QAT as torch.ao.nn.intrinsic.qat.ConvBn(ReLU)2d
  // (nn/conv_bn.cpp).
  ValueId conv_bn(ValueId x, int64_t in_channels, int64_t out_channels, int64_t kernel,
                  const std::string& name, int64_t stride = 1, int64_t padding = 0,
                  bool relu = true);
  ValueId max_pool2d(ValueId x, int64_t kernel, const std::string& name);     // nn/pooling.cpp
  ValueId global_avg_pool(ValueId x, const std::string& name);                // [N,C,H,W] -> [N,C]
  ValueId layer_norm(ValueId x, const std::string& name, double eps = 1e-5);  // last axis
  // Llama's RMSNorm over the last axis, weight "<name>.weight" (nn/rms_norm.cpp).
  ValueId rms_norm(ValueId x, const std::string& name, double eps = 1e-6);
  // Rotary position embedding of x [batch, heads, seq, head_dim] at i64 position_ids
  // [batch or 1, seq], by default 0..seq-1 (nn/rotary.cpp).
  ValueId rotary(ValueId x, const std::string& name, double rope_theta = 10000.0,
                 ValueId position_ids = kNoValue);
  // Multi-head self-attention over x [N, T, D] (nn/attention.cpp).
  ValueId attention(ValueId x, int64_t heads, const std::string& name);
  // Pre-norm block: x + MHSA(LN(x)), then x + MLP(LN(x)) with GELU (nn/transformer_block.cpp).
  ValueId transformer_block(ValueId x, int64_t heads, int64_t mlp_hidden, const std::string& name);
  // Tokens [N, T, F] -> linear embedding to D plus a learned positional table of
  // `max_positions` rows (nn/embedding.cpp).
  ValueId token_embedding(ValueId x, int64_t d_model, int64_t max_positions,
                          const std::string& name);
  ValueId cross_entropy(ValueId logits, ValueId labels);
  // Llama's SwiGLU MLP: down(silu(gate(x)) * up(x)), no biases (nn/swiglu_mlp.cpp).
  ValueId swiglu_mlp(ValueId x, int64_t intermediate, const std::string& name);
  // Llama's grouped-query causal self-attention over x [N, T, D] (nn/causal_attention.cpp).
  ValueId causal_self_attention(ValueId x, int64_t heads, int64_t kv_heads, double rope_theta,
                                const std::string& name);

  // A parameter initialised from the builder's stream: U(-bound, bound), or a constant fill.
  ValueId uniform_parameter(const std::string& name, const Shape& shape, double bound);
  ValueId filled_parameter(const std::string& name, const Shape& shape, double value,
                           bool trainable = true);

  Graph& graph() { return g_; }
  const QConfig& qconfig() const { return qc_; }
  const PrecisionPolicy& precision() const { return precision_; }
  const std::vector<LinearLayer>& layers() const { return layers_; }
  const std::vector<WeightQuantizer>& weight_quantizers() const { return weights_; }
  const std::vector<ConvBnLayer>& conv_bn_layers() const { return conv_bns_; }
  // Trainable parameters, in creation order (buffers such as BN running stats excluded).
  std::vector<ValueId> parameters() const { return params_; }
  NodeId input_observer() const { return input_observer_; }

 private:
  ValueId dynamic_token_quant(ValueId x, const std::string& name);
  // The integer forward of a linear (nn/integer_linear.cpp): x_compute @ w_compute^T computed
  // as int8_matmul_ste on the codes of `operand`'s per-token quantizer and of the last weight
  // quantizer, which records the node.
  ValueId integer_matmul(ValueId operand, ValueId x_compute, ValueId w_compute,
                         const std::string& name);
  // The learned-range quantizer of rec.source (nn/learned_ranges.cpp): its scale parameter,
  // initialised from the source's initial value, and the lsq_fake_quantize node.
  ValueId learned_weight(WeightQuantizer& rec, int64_t group, const std::string& name);

  Graph& g_;
  QConfig qc_;
  PrecisionPolicy precision_;
  Rng rng_;
  std::vector<LinearLayer> layers_;
  std::vector<WeightQuantizer> weights_;
  std::vector<ConvBnLayer> conv_bns_;
  std::vector<ValueId> params_;
  NodeId input_observer_ = -1;
  GemmInputSharing sharing_ = GemmInputSharing::quantizer;
  // integer_matmul's activation codes per quantized operand, shared by the linears reading it.
  std::map<ValueId, ValueId> operand_codes_;
  // gemm_operand's shared chains: (source value, rows of the flattened operand, the
  // operand's dtype) -> the chain's output.
  std::map<std::tuple<ValueId, int64_t, DType>, ValueId> shared_operands_;
};

// Throws unless x is [N, in_channels, H, W] (conv layers; `op` names the layer kind).
void check_conv_input(const Graph& g, ValueId x, int64_t in_channels, const std::string& op,
                      const std::string& layer);

// The shape of a value (shorthand for layers).
inline const Shape& shape_of_value(const Graph& g, ValueId v) {
  return g.value(v).type.shape;
}

}  // namespace qg::nn
