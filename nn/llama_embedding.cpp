#include "nn/llama_embedding.h"

#include <algorithm>

#include "core/error.h"

namespace qg::nn {
namespace {

// Elements per qparam along a row of `width`: a group wider than the row is the row.
int64_t group_length(int64_t group, int64_t width) {
  return std::min(group, width);
}

}  // namespace

WeightQuant parse_embedding_quant(const std::string& s) {
  if (s == "none" || s == "float") return WeightQuant::none;
  if (s == "int8" || s == "8") return WeightQuant::int8;
  if (s == "int4" || s == "4") return WeightQuant::int4;
  QG_FAIL("qconfig", "embedding quantization '", s, "' is not one of none, int8, int4");
}

QConfig embedding_weight_qconfig(const QConfig& qc) {
  QG_CHECK(qc.embedding_quantized(), "qconfig", qc.str(), " has no quantized embedding");
  qc.validate();
  QConfig e;
  e.weight = qc.embedding_weight;
  e.weight_scope = "group";
  e.weight_group_size = qc.embedding_group_size;
  e.dynamic_weights = true;
  e.weight_mapping = WeightMapping::symmetric;
  return e;
}

void check_embedding_quant(const QConfig& qc, const LlamaConfig& config) {
  if (!qc.embedding_quantized()) return;
  const int64_t d = config.hidden_size;
  const int64_t group = group_length(qc.embedding_group_size, d);
  QG_CHECK(d % group == 0, "nn.llama", "embedding group size ", qc.embedding_group_size,
           " does not divide hidden_size ", d, " (", qc.str(), ")");
  if (!config.tie_word_embeddings || qc.weight == WeightQuant::none) return;
  // The GEMM recipe's lm_head quantizer on the same [vocab, hidden] table, as Builder::weight
  // builds it: per row (scope channel) or per group of its group size.
  const bool same_codes = qc.dynamic_weights && qc.weight_mapping == WeightMapping::symmetric &&
                          qc.weight == qc.embedding_weight;
  const int64_t lm_head_group = qc.weight_scope == "group" ? group_length(qc.weight_group_size, d)
                                : qc.weight_scope == "channel" ? d
                                                               : 0;
  QG_CHECK(same_codes && lm_head_group == group, "nn.llama",
           "tied embeddings share one quantizer between the embedding and lm_head, but the "
           "embedding's ",
           weight_quant_name(qc.embedding_weight), " per group of ", group, " is not lm_head's (",
           qc.gemm_str(),
           "): untie the embeddings, or quantize the embedding as lm_head's weights");
}

ValueId quantized_embedding_table(Graph& graph, const QConfig& qc, const LlamaConfig& config,
                                  ValueId table, std::vector<WeightQuantizer>& quantizers) {
  if (!qc.embedding_quantized()) return table;
  check_embedding_quant(qc, config);
  // Builder::weight with the embedding's own weight QConfig: one dynamic_fake_quantize node
  // ("model.embed_tokens.weight.dfq") on the [vocab, hidden] table, groups along the hidden
  // dim, and its WeightQuantizer record. That Builder creates no parameter.
  Builder embedding(graph, embedding_weight_qconfig(qc), /*seed=*/0);
  ValueId q = embedding.weight(table, "model.embed_tokens");
  for (const WeightQuantizer& w : embedding.weight_quantizers()) quantizers.push_back(w);
  return q;
}

}  // namespace qg::nn
