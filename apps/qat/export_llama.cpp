// `qat export CHECKPOINT --onnx m.onnx` for a `qat train --model llama` checkpoint.
//
// 1. The checkpoint's meta names the model's sizes and its recipe (LmTrainer's config key);
//    the model's config.json (--config, else the one `qat train` wrote beside the checkpoint)
//    supplies the rest (rope_theta, rms_norm_eps) and must agree with those sizes.
// 2. The model is built at batch = --prompts and seq = --prompt-len + --new-tokens, its
//    weights loaded from the checkpoint and converted to integer codes
//    (nn::convert_to_integer; its named errors come before anything is written).
// 3. The reference is the greedy decode of that converted graph: the prompts in the first
//    positions, each step recomputes the whole window and appends the argmax of the logits
//    at the last real position (the first index of the largest logit). The model is causal:
//    the logits at position t depend only on tokens 0..t (causal attention; rms_norm, the
//    projections and the per-token activation quantizers act on each position alone), so the
//    positions not yet decoded hold token 0 and change nothing that is read.
// 4. The ONNX model (opset 21, INT4 weights) takes input_ids [batch, seq] and gives the logits
//    [batch, seq, vocab]; --reference DIR writes prompts.npy (i64 [B, L]), tokens.npy (i64
//    [B, N], the reference decode) and logits.npy (f32 [B, L, vocab], the first step's logits
//    at the prompt positions) for scripts/onnx_llm_check.py.
#include "apps/qat/export_llama.h"

#ifdef QG_WITH_ONNX

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "apps/qat/train_common.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/npy.h"
#include "export/onnx/onnx_export.h"
#include "nn/convert.h"
#include "nn/llama_config.h"
#include "nn/llama_embedding.h"
#include "nn/qconfig.h"
#include "nn/rng.h"
#include "train/checkpoint.h"
#include "train/checkpoint_states.h"

namespace qg::cli {
namespace {

constexpr const char* kOp = "export";

struct CheckpointModel {
  std::map<std::string, std::string> sizes;  // hidden=64 ... tied=0
  std::string qconfig;                       // QConfig::str()
  nn::PrecisionPolicy precision;             // what the model trained in (f32 when unnamed)
};

// "llama hidden=64 ... tied=0 batch=8 seq=64 qconfig=<QConfig::str()> optimizer=adam", then
// " precision=<PrecisionPolicy::name()>" when it trained in another than f32.
CheckpointModel parse_key(const std::string& key, const std::string& path) {
  const std::string q = " qconfig=", opt = " optimizer=";
  const size_t qa = key.find(q), ob = key.rfind(opt);
  QG_CHECK(
      key.rfind("llama ", 0) == 0 && qa != std::string::npos && ob != std::string::npos && ob > qa,
      kOp, "checkpoint ", path, ": meta config '", key, "' is not a llama model's");
  CheckpointModel m;
  m.qconfig = key.substr(qa + q.size(), ob - qa - q.size());
  const std::string p = " precision=";
  const size_t pa = key.find(p, ob);
  if (pa != std::string::npos) {
    const size_t end = key.find(' ', pa + p.size());
    m.precision = nn::parse_precision(key.substr(
        pa + p.size(), end == std::string::npos ? std::string::npos : end - pa - p.size()));
  }
  std::istringstream in(key.substr(6, qa - 6));
  std::string item;
  while (in >> item) {
    const size_t eq = item.find('=');
    if (eq != std::string::npos) m.sizes[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return m;
}

// The recipe whose QConfig::str() the checkpoint names (group sizes 32..256), with its
// embedding's quantizer (nn/llama_embedding.h) when it names one.
nn::QConfig recipe_of(const std::string& qconfig, const std::string& path, std::string* name) {
  nn::QConfig embedding;
  const std::string gemm = nn::read_embedding_str(qconfig, embedding);
  for (const std::string& r : nn::recipe_names())
    for (int g : {32, 64, 128, 256})
      for (int variant = 0; variant < 3; ++variant) {
        // 0: the recipe, 1: with learned ranges, 2: with the integer forward; both exist for
        // the dynamic symmetric recipes only (qat train --learned-ranges, --integer-forward).
        const bool learned = variant == 1, integer = variant == 2;
        nn::QConfig qc = nn::parse_recipe(r, g);
        if ((learned || integer) &&
            (!qc.dynamic_weights || qc.weight_mapping != nn::WeightMapping::symmetric))
          continue;
        qc.learned_weight_ranges = learned;
        qc.integer_forward = integer;
        if (qc.str() != gemm) continue;
        *name = r == "float" || r == "w8a8_dynamic" ? r : r + " group " + std::to_string(g);
        if (learned) *name += ", learned ranges";
        if (integer) *name += ", integer forward";
        if (embedding.embedding_quantized()) {
          qc.embedding_weight = embedding.embedding_weight;
          qc.embedding_group_size = embedding.embedding_group_size;
          *name += ", embedding " + nn::weight_quant_name(qc.embedding_weight) + " group " +
                   std::to_string(qc.embedding_group_size);
        }
        return qc;
      }
  QG_FAIL(kOp, "checkpoint ", path, ": its recipe '", qconfig,
          "' is none of the language-model recipes (qat train --recipe)");
}

nn::LlamaConfig config_for(const LlamaExportOptions& o, const CheckpointModel& m) {
  std::string path = o.config;
  if (path.empty()) {
    const size_t slash = o.checkpoint.rfind('/');
    path = (slash == std::string::npos ? "" : o.checkpoint.substr(0, slash + 1)) + "config.json";
  }
  nn::LlamaConfig c = nn::load_llama_config(path);
  const std::map<std::string, int64_t> ours = {{"hidden", c.hidden_size},
                                               {"intermediate", c.intermediate_size},
                                               {"layers", c.num_hidden_layers},
                                               {"heads", c.num_attention_heads},
                                               {"kv_heads", c.num_key_value_heads},
                                               {"vocab", c.vocab_size},
                                               {"tied", c.tie_word_embeddings ? 1 : 0}};
  for (const auto& [k, v] : ours) {
    auto it = m.sizes.find(k);
    QG_CHECK(it != m.sizes.end() && it->second == std::to_string(v), kOp, "config ", path, ": ", k,
             " = ", v, ", but checkpoint ", o.checkpoint, " was trained with ", k, " = ",
             it == m.sizes.end() ? std::string("(missing)") : it->second);
  }
  return c;
}

// --prompts windows of --prompt-len tokens: evenly spaced in DIR/validation.tokens
// (data/token_data.h: "QGTOKENS" | u64 key | u64 count | count x i32), else random ids.
Tensor make_prompts(const LlamaExportOptions& o, int64_t vocab) {
  const int64_t b = o.prompts, l = o.prompt_len;
  std::vector<int64_t> ids(static_cast<size_t>(b * l));
  if (o.data.empty()) {
    nn::Rng rng(o.seed);
    for (auto& id : ids) id = static_cast<int64_t>(rng.below(static_cast<uint64_t>(vocab)));
    return Tensor::from_vector<int64_t>({b, l}, ids);
  }
  const std::string path = o.data + "/validation.tokens";
  const std::string bytes = read_file_bytes(path, kOp);
  uint64_t count = 0;
  QG_CHECK(bytes.size() >= 24 && bytes.compare(0, 8, "QGTOKENS") == 0, kOp, path,
           " is not a token file");
  std::memcpy(&count, bytes.data() + 16, 8);
  QG_CHECK(bytes.size() == 24 + 4 * count && static_cast<int64_t>(count) >= l, kOp, path, ": ",
           count, " tokens in ", bytes.size(), " bytes, prompts need ", l);
  const auto* tokens = reinterpret_cast<const int32_t*>(bytes.data() + 24);
  const int64_t span = static_cast<int64_t>(count) - l;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t start = b > 1 ? span * i / (b - 1) : 0;
    for (int64_t t = 0; t < l; ++t) {
      const int32_t id = tokens[start + t];
      QG_CHECK(id >= 0 && id < vocab, kOp, path, ": token ", id, " is outside the vocabulary [0, ",
               vocab, ")");
      ids[static_cast<size_t>(i * l + t)] = id;
    }
  }
  return Tensor::from_vector<int64_t>({b, l}, ids);
}

struct Decode {
  Tensor tokens;       // i64 [B, N]
  Tensor first_steps;  // f32 [B, L, V]: the first step's logits at the prompt positions
  Tensor margins;      // f32 [B, N]: each step's largest logit minus the runner-up
};

Decode greedy_decode(nn::LlamaInstance& inst, const Tensor& prompts, int64_t steps) {
  const int64_t b = prompts.size(0), l = prompts.size(1), s = inst.model.seq;
  const int64_t v = inst.model.config.vocab_size;
  std::vector<int64_t> window(static_cast<size_t>(b * s), 0);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t t = 0; t < l; ++t) window[i * s + t] = prompts.data<int64_t>()[i * l + t];
  const Tensor labels = Tensor::zeros({b, s - 1}, DType::i64);
  std::vector<int64_t> out(static_cast<size_t>(b * steps));
  std::vector<float> first(static_cast<size_t>(b * l * v));
  std::vector<float> margins(static_cast<size_t>(b * steps));
  inst.exec->set_training(false);
  for (int64_t step = 0; step < steps; ++step) {
    Executor::Feeds feeds = {{"input_ids", Tensor::from_vector<int64_t>({b, s}, window)},
                             {"labels", labels}};
    // f32 (bf16 logits of a bf16-mixed model widen exactly).
    const Tensor logits =
        inst.exec->run(feeds, {inst.model.logits})[0].to(Device::cpu()).cast(DType::f32);
    const float* p = logits.data<float>();
    const int64_t at = l - 1 + step;  // the last real position
    for (int64_t i = 0; i < b; ++i) {
      const float* row = p + (i * s + at) * v;
      int64_t best = 0;
      for (int64_t j = 1; j < v; ++j)
        if (row[j] > row[best]) best = j;
      float second = -INFINITY;
      for (int64_t j = 0; j < v; ++j)
        if (j != best && row[j] > second) second = row[j];
      out[static_cast<size_t>(i * steps + step)] = best;
      margins[static_cast<size_t>(i * steps + step)] = row[best] - second;
      window[static_cast<size_t>(i * s + at + 1)] = best;
      if (step == 0) std::memcpy(first.data() + i * l * v, p + i * s * v, sizeof(float) * l * v);
    }
  }
  return {Tensor::from_vector<int64_t>({b, steps}, out),
          Tensor::from_vector<float>({b, l, v}, first),
          Tensor::from_vector<float>({b, steps}, margins)};
}

int64_t f32_weight_bytes(const nn::LlamaInstance& inst) {
  int64_t n = 0;
  for (ValueId p : inst.model.parameters) n += shape_numel(inst.graph->value(p).type.shape);
  return 4 * n;
}

}  // namespace

bool is_llama_checkpoint(const std::map<std::string, std::string>& meta) {
  auto it = meta.find("config");
  return it != meta.end() && it->second.rfind("llama ", 0) == 0;
}

void run_llama_export(const LlamaExportOptions& o, const std::map<std::string, std::string>& meta) {
  QG_CHECK(o.prompts > 0 && o.prompt_len > 0 && o.new_tokens > 0, kOp, "--prompts ", o.prompts,
           ", --prompt-len ", o.prompt_len, " and --new-tokens ", o.new_tokens,
           " must be positive");
  // 1. The model and recipe the checkpoint names.
  const CheckpointModel m = parse_key(meta.at("config"), o.checkpoint);
  std::string recipe;
  nn::QConfig qc = recipe_of(m.qconfig, o.checkpoint, &recipe);
  if (qc.integer_forward) {
    // The ONNX graph dequantizes the int4/int8 weight blocks and runs float MatMuls (ONNX has
    // no GEMM with per-group scales along K), so the reference decode below is the converted
    // model of that arithmetic: the same weights and qparams, the fake-quant forward's
    // rounding instead of int8_matmul's (docs/LLM_NUMERICS.md).
    std::printf(
        "qat export: %s trained with the integer forward; the ONNX model runs float "
        "GEMMs on the dequantized weights\n",
        recipe.c_str());
    qc.integer_forward = false;
  }
  const nn::LlamaConfig config = config_for(o, m);
  const int64_t seq = o.prompt_len + o.new_tokens;
  QG_CHECK(seq <= config.max_position_embeddings, kOp, "--prompt-len ", o.prompt_len,
           " + --new-tokens ", o.new_tokens, " = ", seq,
           " exceeds the model's max_position_embeddings ", config.max_position_embeddings);
  // 2. Its weights, converted to integer codes.
  // In the precision it trained in: its GEMMs and activations are the deployed arithmetic.
  nn::LlamaInstance inst =
      nn::build_llama_instance(config, o.prompts, seq, qc, Device::cpu(), m.precision);
  {
    const std::vector<nn::CheckpointSection> sections = nn::read_checkpoint(o.checkpoint);
    const nn::CheckpointSections by_name(sections, o.checkpoint);
    for (auto& [dst, t] : nn::decode_states(*inst.exec, by_name))
      std::memcpy(dst->raw_data(), t.raw_data(), dst->nbytes());
  }
  const int64_t f32_bytes = f32_weight_bytes(inst);
  const int64_t model_bytes = nn::convert_to_integer(inst, qc);
  // 3. The reference decode.
  const Tensor prompts = make_prompts(o, config.vocab_size);
  const Decode ref = greedy_decode(inst, prompts, o.new_tokens);
  // 4. The ONNX model.
  onnx_export::Options opt;
  opt.graph_name = "qatgraph_llama";
  opt.opset = onnx_export::kInt4Opset;
  opt.doc = "qatgraph llama (" + meta.at("config") + "), " + qc.str() +
            ". 4-bit weight codes are INT4 with blocked DequantizeLinear.";
  opt.metadata = {{"qatgraph.model", "llama"},
                  {"qatgraph.qconfig", qc.str()},
                  {"qatgraph.recipe", recipe},
                  {"qatgraph.step", meta.count("step") ? meta.at("step") : ""},
                  {"qatgraph.precision", m.precision.name()}};
  const onnx_export::Result r = onnx_export::export_graph(
      *inst.graph, *inst.exec, inst.model.input_ids, inst.model.logits, opt);
  for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  nn::write_file_atomic(o.onnx, r.bytes);
  if (!o.reference.empty()) {
    ensure_dir(o.reference);
    save_npy(o.reference + "/prompts.npy", prompts);
    save_npy(o.reference + "/tokens.npy", ref.tokens);
    save_npy(o.reference + "/logits.npy", ref.first_steps);
    save_npy(o.reference + "/margins.npy", ref.margins);
  }
  // 5. Summary.
  std::printf("qat export: llama %s, %s (step %s) -> %s\n", recipe.c_str(), qc.str().c_str(),
              meta.count("step") ? meta.at("step").c_str() : "?", o.onnx.c_str());
  // bf16-mixed: every bf16 value is an f32 tensor of the file holding it exactly, rounded by
  // a Cast to BFLOAT16 and back wherever qatgraph rounds (export/onnx/onnx_context.h).
  std::printf("precision: %s%s\n", m.precision.str().c_str(),
              m.precision.mixed() ? "; each rounding to bf16 is a Cast pair in the file" : "");
  std::string ops;
  for (const auto& [op, n] : r.op_counts)
    ops += (ops.empty() ? "" : ", ") + op + " " + std::to_string(n);
  std::printf("ONNX opset %lld: %d nodes (%s), %d initializers\n",
              static_cast<long long>(opt.opset), r.nodes, ops.c_str(), r.initializers);
  std::printf(
      "size: %lld bytes of initializers, file %zu bytes; converted graph %lld model bytes; "
      "the f32 weights: %lld bytes (%.2fx the file)\n",
      static_cast<long long>(r.initializer_bytes), r.bytes.size(),
      static_cast<long long>(model_bytes), static_cast<long long>(f32_bytes),
      static_cast<double>(f32_bytes) / static_cast<double>(r.bytes.size()));
  std::printf(
      "reference: %lld prompts of %lld tokens, %lld greedy tokens each, batch %lld x %lld\n",
      static_cast<long long>(o.prompts), static_cast<long long>(o.prompt_len),
      static_cast<long long>(o.new_tokens), static_cast<long long>(o.prompts),
      static_cast<long long>(seq));
  if (!o.reference.empty())
    std::printf("wrote %s/prompts.npy, tokens.npy, logits.npy, margins.npy\n", o.reference.c_str());
}

}  // namespace qg::cli

#endif  // QG_WITH_ONNX
