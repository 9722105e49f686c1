#include "nn/hf_llama_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/printable.h"

namespace qg::nn {
namespace {

constexpr const char* kOp = "nn.import";
constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kLmHead = "lm_head.weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <typename T>
void compare(std::vector<std::string>& out, const char* field, const T& model, const T& file) {
  if (model == file) return;
  std::ostringstream os;
  os.precision(17);
  os << std::boolalpha << field << ": " << model << " (model) vs " << file << " (file)";
  out.push_back(os.str());
}

std::string describe(const HfCheckpoint& ck, const std::string& name) {
  const Tensor& t = ck.tensors.at(name);
  return name + " (" + ck.source.at(name) + ") is " + dtype_name(t.dtype()) + shape_str(t.shape());
}

// The sizes the tensors imply, against the config's (check 2 of the header).
void check_sizes_against_config(const LlamaConfig& c, const HfCheckpoint& ck,
                                const std::string& config_path) {
  std::vector<std::string> problems;
  auto rank2 = [&](const std::string& name) -> const Tensor* {
    auto it = ck.tensors.find(name);
    return it != ck.tensors.end() && it->second.dim() == 2 ? &it->second : nullptr;
  };
  auto expect = [&](const char* field, int64_t want, int64_t got, const std::string& name) {
    if (want != got)
      problems.push_back(std::string(field) + " is " + std::to_string(want) +
                         " in config.json, but " + describe(ck, name) + ": " + field + " " +
                         std::to_string(got));
  };
  if (const Tensor* e = rank2(kEmbed)) {
    expect("vocab_size", c.vocab_size, e->size(0), kEmbed);
    expect("hidden_size", c.hidden_size, e->size(1), kEmbed);
  }
  const std::string layer0 = "model.layers.0.";
  if (const Tensor* g = rank2(layer0 + "mlp.gate_proj.weight"))
    expect("intermediate_size", c.intermediate_size, g->size(0), layer0 + "mlp.gate_proj.weight");
  if (const Tensor* k = rank2(layer0 + "self_attn.k_proj.weight")) {
    const int64_t rows = k->size(0), hd = c.head_dim();
    if (rows % hd != 0)
      problems.push_back("num_key_value_heads x head_dim is " +
                         std::to_string(c.num_key_value_heads * hd) + " in config.json, but " +
                         describe(ck, layer0 + "self_attn.k_proj.weight") +
                         ": not a multiple of head_dim " + std::to_string(hd));
    else
      expect("num_key_value_heads", c.num_key_value_heads, rows / hd,
             layer0 + "self_attn.k_proj.weight");
  }
  // The layer count: one more than the highest model.layers.<i> index present.
  int64_t layers = 0;
  std::string deepest;
  const std::string prefix = "model.layers.";
  for (const auto& [name, t] : ck.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    const std::string index = name.substr(prefix.size(), dot - prefix.size());
    if (index.empty() || index.size() > 9 ||
        index.find_first_not_of("0123456789") != std::string::npos)
      continue;  // not a layer index: import_weights lists the name as unmatched
    const int64_t i = std::stoll(index);
    if (i + 1 > layers) layers = i + 1, deepest = name;
  }
  if (layers > 0 && layers != c.num_hidden_layers)
    problems.push_back("num_hidden_layers is " + std::to_string(c.num_hidden_layers) +
                       " in config.json, but the weights have model.layers.0 to " +
                       std::to_string(layers - 1) + " (" + deepest + "): num_hidden_layers " +
                       std::to_string(layers));
  if (problems.empty()) return;
  std::ostringstream os;
  os << "'" << printable(config_path) << "' does not match the weights of its checkpoint ("
     << ck.files.size() << " file(s)); nothing was changed:";
  for (const std::string& p : problems) os << "\n  " << p;
  QG_FAIL(kOp, os.str());
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

LlamaConfig load_hf_llama_config(const std::string& dir) {
  return load_llama_config(join_path(dir, "config.json"));
}

std::vector<std::string> llama_config_differences(const LlamaConfig& model,
                                                  const LlamaConfig& file) {
  std::vector<std::string> out;
  compare(out, "hidden_size", model.hidden_size, file.hidden_size);
  compare(out, "intermediate_size", model.intermediate_size, file.intermediate_size);
  compare(out, "num_hidden_layers", model.num_hidden_layers, file.num_hidden_layers);
  compare(out, "num_attention_heads", model.num_attention_heads, file.num_attention_heads);
  compare(out, "num_key_value_heads", model.num_key_value_heads, file.num_key_value_heads);
  compare(out, "vocab_size", model.vocab_size, file.vocab_size);
  compare(out, "max_position_embeddings", model.max_position_embeddings,
          file.max_position_embeddings);
  compare(out, "rms_norm_eps", model.rms_norm_eps, file.rms_norm_eps);
  compare(out, "rope_theta", model.rope_theta, file.rope_theta);
  compare(out, "tie_word_embeddings", model.tie_word_embeddings, file.tie_word_embeddings);
  return out;
}

NameMatch hf_llama_name_match(const std::string& file_name) {
  NameMatch m;
  if (ends_with(file_name, "rotary_emb.inv_freq")) {
    m.ignore_reason =
        "rotary frequencies: the rotary layer derives them from rope_theta and the head dim";
    return m;
  }
  m.candidates.push_back(file_name);
  return m;
}

ImportReport import_hf_llama(Executor& exec, const LlamaConfig& model_config,
                             const std::string& dir) {
  const std::string config_path = join_path(dir, "config.json");
  const LlamaConfig file_config = load_llama_config(config_path);
  const std::vector<std::string> diffs = llama_config_differences(model_config, file_config);
  if (!diffs.empty()) {
    std::ostringstream os;
    os << "the model was built from a config that differs from '" << printable(config_path)
       << "'; nothing was changed:";
    for (const std::string& d : diffs) os << "\n  " << d;
    QG_FAIL(kOp, os.str());
  }
  HfCheckpoint ck = read_hf_checkpoint(dir);
  check_sizes_against_config(file_config, ck, config_path);

  bool tied_copy = false;  // lm_head.weight is a second copy of the tied embedding table
  if (file_config.tie_word_embeddings && ck.tensors.count(kLmHead) && ck.tensors.count(kEmbed)) {
    const Tensor& head = ck.tensors.at(kLmHead);
    const Tensor& embed = ck.tensors.at(kEmbed);
    QG_CHECK(same_values(head, embed), kOp, "'", printable(config_path),
             "' ties the embeddings, but the checkpoint's ", describe(ck, kLmHead),
             " and differs from ", describe(ck, kEmbed),
             head.shape() == embed.shape()
                 ? " by up to " + std::to_string(max_abs_difference(head, embed))
                 : std::string(),
             ": the tied model would drop lm_head.weight; nothing was changed");
    tied_copy = true;
  }
  const NameMapper mapper = [tied_copy](const std::string& name) {
    NameMatch m = hf_llama_name_match(name);
    if (tied_copy && name == kLmHead) {
      m.candidates.clear();
      m.ignore_reason =
          "tie_word_embeddings: the same values as model.embed_tokens.weight, which the tied "
          "lm_head reads";
    }
    return m;
  };
  std::string what = "the checkpoint '" + printable(dir) + "' (";
  what += ck.files.size() == 1 ? ck.files[0] : std::to_string(ck.files.size()) + " shards";
  what += ")";
  return import_weights(exec, ck.tensors, mapper, what);
}

}  // namespace qg::nn
