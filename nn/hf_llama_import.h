// Importing a Hugging Face Llama checkpoint folder (config.json plus safetensors weights,
// one file or sharded: nn/hf_checkpoint.h) into a model built by build_llama, whose
// parameter names are transformers' state-dict keys, so names map one to one.
//
// Checks, in order, each a qg::Error with op "nn.import" (config.json's own errors are
// nn.llama_config's), and nothing is written unless all pass:
//   1. the folder's config.json equals the config the model was built from, field by field
//      (sizes, rms_norm_eps, rope_theta, max_position_embeddings, tie_word_embeddings);
//   2. the weights agree with that config: the sizes read off the tensors
//      (model.embed_tokens.weight [vocab, hidden], layer 0's mlp.gate_proj [intermediate,
//      hidden] and self_attn.k_proj [kv_heads * head_dim, hidden], the number of
//      model.layers.<i>) against the config's, so a config from another model is named as
//      such rather than as a list of shape mismatches;
//   3. nn/import_weights: every file tensor placed, every parameter found, shapes equal,
//      values finite, in one error listing every problem.
// Dtypes: the file's f32, bf16 and f16 tensors convert to the parameters' dtype; widening
// (bf16 or f16 into f32) is exact, narrowing (f32 into bf16 parameters) rounds to nearest
// even, and a value beyond the narrower range is refused as not finite.
// Names left out, with the reason in the report:
//   - *.rotary_emb.inv_freq (older transformers saved the rotary frequencies as a buffer):
//     the rotary layer derives them from rope_theta and the head dim;
//   - lm_head.weight in a checkpoint whose config ties the embeddings, when it holds exactly
//     model.embed_tokens.weight's values (an exporter that wrote both names of the shared
//     tensor). Different values are an error: the tied model would silently drop them.
#pragma once

#include <string>
#include <vector>

#include "nn/hf_checkpoint.h"
#include "nn/import_weights.h"
#include "nn/llama_config.h"
#include "runtime/executor.h"

namespace qg::nn {

// The folder's config.json.
LlamaConfig load_hf_llama_config(const std::string& dir);

// "field: a (model) vs b (file)" for each field where `model` and `file` differ.
std::vector<std::string> llama_config_differences(const LlamaConfig& model,
                                                  const LlamaConfig& file);

// The name rule: each name as it is, except *.rotary_emb.inv_freq (ignored, see above).
NameMatch hf_llama_name_match(const std::string& file_name);

// Imports the checkpoint folder `dir` into `exec`, whose graph build_llama built from
// `model_config` (for a training step, the CompiledStep's executor(): the values are
// written into the parameters' own buffers, which its static run reads).
ImportReport import_hf_llama(Executor& exec, const LlamaConfig& model_config,
                             const std::string& dir);

}  // namespace qg::nn
