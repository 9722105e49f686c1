#include "nn/llama.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "nn/llama_embedding.h"

namespace qg::nn {
namespace {

// The tied lm_head: logits = h E^T with the embedding table E [V, D] as the weight, through
// the same quantizers a Linear applies (the table is the one parameter both read). A quantized
// embedding's table `quantized` is already the weight's fake-quant: one quantizer serves both
// (nn/llama_embedding.h).
ValueId tied_lm_head(Builder& b, ValueId h, ValueId table, ValueId quantized) {
  Graph& g = b.graph();
  ValueId x = b.gemm_operand(h, "lm_head");
  ValueId w =
      b.to_compute(quantized != table ? quantized : b.weight(table, "lm_head"), "lm_head.weight");
  return g.apply1("matmul", {b.gemm_operand_to_compute(h, x, "lm_head"), w},
                  {{"transpose_b", true}}, "lm_head.matmul");
}

}  // namespace

LlamaModel build_llama(Graph& graph, const LlamaConfig& config, int64_t batch, int64_t seq,
                       const QConfig& qconfig, uint64_t seed, const PrecisionPolicy& precision,
                       GemmInputSharing sharing) {
  QG_CHECK(batch > 0 && seq >= 2 && seq <= config.max_position_embeddings, "nn.llama", "batch ",
           batch, " must be positive and seq ", seq,
           " within [2, max_position_embeddings = ", config.max_position_embeddings,
           "] (the loss needs a next token)");
  QG_CHECK(config.hidden_size > 0 && config.num_attention_heads > 0 && config.vocab_size > 0 &&
               config.num_hidden_layers > 0,
           "nn.llama", "an unset config: hidden_size ", config.hidden_size, ", heads ",
           config.num_attention_heads, ", vocab ", config.vocab_size, ", layers ",
           config.num_hidden_layers);
  Builder b(graph, qconfig, seed, precision);
  b.set_gemm_input_sharing(sharing);
  LlamaModel m;
  m.config = config;
  m.batch = batch;
  m.seq = seq;
  const int64_t d = config.hidden_size, vocab = config.vocab_size, rows = batch * seq;
  m.input_ids = graph.input("input_ids", {DType::i64, {batch, seq}});
  m.labels = graph.input("labels", {DType::i64, {batch, seq - 1}});

  // transformers initialises embeddings with N(0, 0.02); a uniform of the same deviation.
  ValueId table =
      b.uniform_parameter("model.embed_tokens.weight", {vocab, d}, 0.02 * std::sqrt(3.0));
  ValueId table_q = quantized_embedding_table(graph, qconfig, config, table, m.embedding_weights);
  ValueId h = graph.apply1("embedding", {table_q, m.input_ids}, {}, "model.embed_tokens");
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    const NodeId block_begin = graph.num_nodes();
    ValueId a = b.rms_norm(h, layer + ".input_layernorm", config.rms_norm_eps);
    a = b.causal_self_attention(a, config.num_attention_heads, config.num_key_value_heads,
                                config.rope_theta, layer + ".self_attn");
    a = b.to_parameter(a, layer + ".self_attn");
    h = b.act(graph.apply1("add", {h, a}, {}, layer + ".residual1"), layer + ".residual1");
    ValueId f = b.rms_norm(h, layer + ".post_attention_layernorm", config.rms_norm_eps);
    f = b.swiglu_mlp(f, config.intermediate_size, layer + ".mlp");
    f = b.to_parameter(f, layer + ".mlp");
    h = b.act(graph.apply1("add", {h, f}, {}, layer + ".residual2"), layer + ".residual2");
    m.blocks.push_back({layer, block_begin, graph.num_nodes()});
  }
  h = b.rms_norm(h, "model.norm", config.rms_norm_eps);
  // [rows, vocab]: the GEMM's own layout, which the loss reads before the logits' reshape.
  ValueId flat;
  if (config.tie_word_embeddings) {
    flat = tied_lm_head(b, h, table, table_q);
  } else {
    ValueId x = graph.apply1("reshape", {h}, {{"shape", Shape{rows, d}}}, "lm_head.rows");
    flat = b.linear(x, vocab, "lm_head", false, false, /*bias=*/false);
  }
  m.logits = graph.apply1("reshape", {flat}, {{"shape", Shape{batch, seq, vocab}}}, "logits");
  graph.set_name(m.logits, "logits");

  // Next-token loss: the logits rows of positions 0..seq-2 of each sequence, gathered with
  // the embedding op (whose backward scatters the gradient back to those rows).
  std::vector<int64_t> keep;
  keep.reserve(static_cast<size_t>(batch * (seq - 1)));
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t t = 0; t + 1 < seq; ++t) keep.push_back(bi * seq + t);
  ValueId rows_kept = graph.constant(
      Tensor::from_vector<int64_t>({static_cast<int64_t>(keep.size())}, keep), "loss.positions");
  ValueId shifted = graph.apply1("embedding", {flat, rows_kept}, {}, "loss.shift_logits");
  ValueId labels = graph.apply1("reshape", {m.labels}, {{"shape", Shape{batch * (seq - 1)}}},
                                "loss.shift_labels");
  m.loss = b.cross_entropy(shifted, labels);
  graph.set_name(m.loss, "loss");
  m.layers = b.layers();
  m.weights = b.weight_quantizers();
  m.parameters = b.parameters();
  return m;
}

Tensor next_token_labels(const Tensor& input_ids) {
  QG_CHECK(
      input_ids.dtype() == DType::i64 && input_ids.shape().size() == 2 && input_ids.size(1) >= 2,
      "nn.llama", "next_token_labels needs i64 [batch, seq >= 2] ids, got ",
      dtype_name(input_ids.dtype()), " ", shape_str(input_ids.shape()));
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  Tensor ids = input_ids.to(Device::cpu());
  const int64_t* p = ids.data<int64_t>();
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(batch * (seq - 1)));
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t t = 1; t < seq; ++t) out.push_back(p[bi * seq + t]);
  return Tensor::from_vector<int64_t>({batch, seq - 1}, out);
}

}  // namespace qg::nn
