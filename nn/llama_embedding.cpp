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

std::string read_embedding_str(const std::string& str, QConfig& qc) {
  const std::string mark = " + embedding ", per = " per group of ";
  const size_t at = str.find(mark);
  qc.embedding_weight = WeightQuant::none;
  if (at == std::string::npos) return str;
  const std::string rest = str.substr(at + mark.size());
  const size_t p = rest.find(per);
  bool ok = p != std::string::npos && p + per.size() < rest.size();
  if (ok) {
    const std::string digits = rest.substr(p + per.size());
    const std::string bits = rest.substr(0, p);
    ok = (bits == "int8" || bits == "int4") && digits.size() <= 9 &&
         digits.find_first_not_of("0123456789") == std::string::npos;
    if (ok) {
      qc.embedding_weight = parse_embedding_quant(bits);
      qc.embedding_group_size = std::stoi(digits);
      ok = qc.embedding_quantized() && qc.embedding_group_size > 0;
    }
  }
  QG_CHECK(ok, "qconfig", "'", rest, "' in '", str,
           "' is not an embedding recipe such as 'int4 per group of 32'");
  return str.substr(0, at);
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
