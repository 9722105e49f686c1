#include "nn/llama_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"

namespace qg::nn {
namespace {

constexpr const char* kOp = "nn.llama_config";
using Json = nlohmann::json;

const Json* field(const Json& j, const char* name, bool required, const std::string& what) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    QG_CHECK(!required, kOp, what, ": required field '", name, "' is missing");
    return nullptr;
  }
  return &*it;
}

// A positive integer field; JSON floats such as 32.0 are refused, as transformers would
// reject a float size.
void read_size(const Json& j, const char* name, bool required, const std::string& what,
               int64_t& out) {
  const Json* v = field(j, name, required, what);
  if (!v) return;
  QG_CHECK(v->is_number_integer(), kOp, what, ": field '", name, "' must be an integer, got ",
           v->dump());
  out = v->get<int64_t>();
  QG_CHECK(out > 0, kOp, what, ": field '", name, "' must be positive, got ", out);
}

void read_positive(const Json& j, const char* name, const std::string& what, double& out) {
  const Json* v = field(j, name, false, what);
  if (!v) return;
  QG_CHECK(v->is_number(), kOp, what, ": field '", name, "' must be a number, got ", v->dump());
  out = v->get<double>();
  QG_CHECK(out > 0, kOp, what, ": field '", name, "' must be positive, got ", out);
}

// The rotary settings as an object: transformers 5 writes "rope_parameters": {"rope_type":
// "default", "rope_theta": ...} instead of a top-level rope_theta (and may echo it as
// "rope_scaling"); 4.x writes "rope_scaling" only for a scaled rotary. Only the default
// (unscaled) type is this decoder's: any other type or key is refused, and a rope_theta given
// twice must agree. "type" is the older spelling of "rope_type".
void read_rope_object(const Json& j, const char* name, const std::string& what, double& theta) {
  const Json* v = field(j, name, false, what);
  if (!v) return;
  QG_CHECK(v->is_object(), kOp, what, ": field '", name, "' must be an object, got ", v->dump());
  // The type first: a scaled rotary is named as such rather than by its first extra key.
  for (const char* type : {"rope_type", "type"})
    if (const Json* t = field(*v, type, false, what))
      QG_CHECK(*t == "default", kOp, what, ": field '", name, "' = ", v->dump(),
               " is not supported (rope_type \"default\" only)");
  for (const auto& [key, value] : v->items())
    QG_CHECK(key == "rope_type" || key == "type" || key == "rope_theta", kOp, what, ": field '",
             name, "' = ", v->dump(), " is not supported (key '", key, "'; plain rope_theta only)");
  const Json* t = field(*v, "rope_theta", false, what);
  if (!t) return;
  QG_CHECK(t->is_number() && t->get<double>() > 0, kOp, what, ": field '", name,
           ".rope_theta' must be a positive number, got ", t->dump());
  const bool given =
      field(j, "rope_theta", false, what) != nullptr ||
      (std::string(name) == "rope_scaling" && field(j, "rope_parameters", false, what));
  QG_CHECK(!given || theta == t->get<double>(), kOp, what, ": field '", name,
           ".rope_theta' = ", t->dump(), " differs from the rope_theta given elsewhere (", theta,
           ")");
  theta = t->get<double>();
}

}  // namespace

LlamaConfig parse_llama_config(const std::string& json_text, const std::string& what) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  QG_CHECK(j.is_object(), kOp, what, ": not a JSON object");
  LlamaConfig c;
  read_size(j, "hidden_size", true, what, c.hidden_size);
  read_size(j, "intermediate_size", true, what, c.intermediate_size);
  read_size(j, "num_hidden_layers", true, what, c.num_hidden_layers);
  read_size(j, "num_attention_heads", true, what, c.num_attention_heads);
  read_size(j, "vocab_size", true, what, c.vocab_size);
  c.num_key_value_heads = c.num_attention_heads;
  read_size(j, "num_key_value_heads", false, what, c.num_key_value_heads);
  read_size(j, "max_position_embeddings", false, what, c.max_position_embeddings);
  read_positive(j, "rms_norm_eps", what, c.rms_norm_eps);
  read_positive(j, "rope_theta", what, c.rope_theta);
  read_rope_object(j, "rope_parameters", what, c.rope_theta);
  read_rope_object(j, "rope_scaling", what, c.rope_theta);
  if (const Json* v = field(j, "tie_word_embeddings", false, what)) {
    QG_CHECK(v->is_boolean(), kOp, what,
             ": field 'tie_word_embeddings' must be true or false, got ", v->dump());
    c.tie_word_embeddings = v->get<bool>();
  }

  QG_CHECK(c.hidden_size % c.num_attention_heads == 0, kOp, what, ": field 'num_attention_heads' (",
           c.num_attention_heads, ") must divide hidden_size (", c.hidden_size, ")");
  QG_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, kOp, what,
           ": field 'num_key_value_heads' (", c.num_key_value_heads,
           ") must divide num_attention_heads (", c.num_attention_heads, ")");
  QG_CHECK(c.head_dim() % 2 == 0, kOp, what,
           ": the head dim hidden_size / num_attention_heads = ", c.head_dim(),
           " must be even (rotary embedding)");
  if (const Json* v = field(j, "head_dim", false, what))
    QG_CHECK(v->is_number_integer() && v->get<int64_t>() == c.head_dim(), kOp, what,
             ": field 'head_dim' = ", v->dump(),
             " differs from hidden_size / num_attention_heads = ", c.head_dim(),
             ", which this decoder requires");
  if (const Json* v = field(j, "hidden_act", false, what))
    QG_CHECK(*v == "silu", kOp, what, ": field 'hidden_act' = ", v->dump(),
             " is not supported (only \"silu\")");
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (const Json* v = field(j, bias, false, what))
      QG_CHECK(*v == false, kOp, what, ": field '", bias, "' = ", v->dump(),
               " is not supported (projections have no bias)");
  }
  return c;
}

LlamaConfig load_llama_config(const std::string& path) {
  return parse_llama_config(read_file_bytes(path, kOp), path);
}

}  // namespace qg::nn
