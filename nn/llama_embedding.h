// The quantized token embedding of the Llama decoder (QConfig::embedding_weight), torchao's
// embedding QAT (FakeQuantizedEmbedding with an IntxFakeQuantizeConfig weight config, which
// Int4WeightOnlyEmbeddingQATQuantizer builds for int4):
//   table_q = dynamic_fake_quantize(table)   symmetric signed codes [-2^(b-1), 2^(b-1) - 1]
//                                            per group of embedding_group_size along the
//                                            hidden dim of the [vocab, hidden] table, scale
//                                            = max|group| / ((qmax - qmin) / 2) in f32 (its
//                                            scale_precision), at least the table dtype's
//                                            smallest normal (its eps), zero point 0
//   h = embedding(table_q, input_ids)        the gather reads the fake-quantized table
// The table is fake-quantized before the gather, so the gather's scatter-add backward reaches
// it through the straight-through estimator (dynamic_fake_quantize's mask). Under a mixed
// precision policy the quantizer reads the master table in the parameter dtype, as the GEMM
// weights' quantizers do, and the gather's output stays in that dtype (the residual stream).
// A group size larger than the hidden size is one group per row (torchao's qparam function
// clamps it so); one that does not divide it is refused.
//
// Tied embeddings (tie_word_embeddings): the table is lm_head's weight too, and one quantizer
// serves both, so the deployed model holds one table of codes. lm_head then reads the
// embedding's fake-quantized table (under a float GEMM recipe too); when the GEMM recipe also
// quantizes weights, its weight quantizer must be the embedding's (dynamic, symmetric, same
// bits and group length), else the build is refused.
#pragma once

#include <string>
#include <vector>

#include "core/graph.h"
#include "nn/builder.h"
#include "nn/llama_config.h"
#include "nn/qconfig.h"

namespace qg::nn {

// "none" (or "float"), "int8" (or "8"), "int4" (or "4"); throws qg::Error (op "qconfig")
// otherwise.
WeightQuant parse_embedding_quant(const std::string& s);

// Reads back the embedding part of a QConfig::str(): sets qc's embedding fields from the
// " + embedding int4 per group of 32" suffix of `str` (a float embedding without one) and
// returns the part before it, the GEMM recipe's QConfig::gemm_str(). Throws qg::Error (op
// "qconfig") for a suffix that is not one str() writes.
std::string read_embedding_str(const std::string& str, QConfig& qc);

// The weight QConfig of the embedding's quantizer (what Builder::weight and the conversion
// pass read for it): dynamic symmetric embedding_weight codes per group. Throws qg::Error when
// qc has no quantized embedding.
QConfig embedding_weight_qconfig(const QConfig& qc);

// Throws qg::Error (op "nn.llama") when the embedding's group size does not divide the hidden
// size (while being smaller than it), or when the embeddings are tied and the GEMM recipe's
// lm_head quantizer is not the embedding's.
void check_embedding_quant(const QConfig& qc, const LlamaConfig& config);

// The table the gather (and a tied lm_head) reads: `table` itself for a float embedding, else
// its fake-quantized copy ("model.embed_tokens.weight.dfq"), whose quantizer is appended to
// `quantizers` for the conversion pass.
ValueId quantized_embedding_table(Graph& graph, const QConfig& qc, const LlamaConfig& config,
                                  ValueId table, std::vector<WeightQuantizer>& quantizers);

}  // namespace qg::nn
