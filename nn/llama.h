// A Llama-architecture decoder (transformers' LlamaForCausalLM) built from a LlamaConfig:
//   h = embed_tokens(input_ids)                           "model.embed_tokens.weight" [V, D]
//   for each layer i ("model.layers.<i>"):
//     h = h + self_attn(input_layernorm(h))               grouped-query causal attention
//     h = h + mlp(post_attention_layernorm(h))            SwiGLU
//   logits = lm_head(norm(h))                             "model.norm", "lm_head.weight"
//                                                         [V, D], or embed_tokens' when tied
// Parameter names are transformers' state-dict keys, so checkpoints map one to one.
// Graph inputs: "input_ids" i64 [batch, seq] and "labels" i64 [batch, seq - 1], the next
// token of each position but the last (next_token_labels makes them from the ids; the
// labels LlamaForCausalLM takes are shifted the same way inside it). Outputs "logits"
// [batch, seq, vocab] (in the compute dtype) and "loss" (f32, or f64 for f64 parameters):
// the mean cross-entropy of logits[:, :-1] against the labels. Shapes are fixed at build time, as
// for every model here.
#pragma once

#include <cstdint>
#include <vector>

#include "autograd/recompute.h"
#include "core/graph.h"
#include "core/tensor.h"
#include "nn/builder.h"
#include "nn/llama_config.h"

namespace qg::nn {

struct LlamaModel {
  LlamaConfig config;
  int64_t batch = 0, seq = 0;
  ValueId input_ids = kNoValue, labels = kNoValue, logits = kNoValue, loss = kNoValue;
  std::vector<LinearLayer> layers;  // every Linear: the projections and an untied lm_head
  std::vector<WeightQuantizer> weights;
  // The token embedding's quantizer (nn/llama_embedding.h): empty for a float table.
  std::vector<WeightQuantizer> embedding_weights;
  std::vector<ValueId> parameters;  // trainable, in creation order
  // Each decoder layer's nodes ("model.layers.<i>"), in order: the regions whose activations
  // a training step may recompute (TrainingSpec::recompute).
  std::vector<RecomputeRegion> blocks;
};

// Throws qg::Error (op "nn.llama") for seq < 2, seq > max_position_embeddings or batch < 1.
// `precision` (nn/qconfig.h) as torch.autocast applies it: parameters, the embedding output
// and the residual stream in the parameter dtype; every GEMM (projections, MLP, lm_head) and
// the attention in the compute dtype, whose outputs are cast back before each residual add;
// RMSNorm's statistics and the loss in f32 (the logits stay in the compute dtype).
// A quantized embedding (QConfig::embedding_weight) is nn/llama_embedding.h's; its errors
// are that file's.
// `sharing`: which part of the GEMM-input chain the projections that read one normed input
// (q/k/v, gate/up) share (nn/builder.h).
LlamaModel build_llama(Graph& graph, const LlamaConfig& config, int64_t batch, int64_t seq,
                       const QConfig& qconfig, uint64_t seed,
                       const PrecisionPolicy& precision = PrecisionPolicy::f32(),
                       GemmInputSharing sharing = GemmInputSharing::quantizer);

// labels[b, t] = input_ids[b, t + 1]: i64 [batch, seq] -> [batch, seq - 1].
Tensor next_token_labels(const Tensor& input_ids);

}  // namespace qg::nn
