#include "ops/attention/attention_backend.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qg {

AttentionBackend parse_attention_backend(const std::string& op, const char* value) {
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0)
    return AttentionBackend::automatic;
  if (std::strcmp(value, "cudnn") == 0) return AttentionBackend::cudnn;
  if (std::strcmp(value, "kernel") == 0) return AttentionBackend::kernel;
  QG_FAIL(op, "QG_ATTENTION_BACKEND = '", value, "' is not one of auto, cudnn, kernel");
}

AttentionBackend attention_backend(const std::string& op) {
  return parse_attention_backend(op, std::getenv("QG_ATTENTION_BACKEND"));
}

const char* attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::automatic:
      return "auto";
    case AttentionBackend::cudnn:
      return "cudnn";
    case AttentionBackend::kernel:
      return "kernel";
  }
  return "?";
}

bool attention_deterministic(const std::string& op) {
  const char* v = std::getenv("QG_ATTENTION_DETERMINISTIC");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
  QG_CHECK(std::strcmp(v, "0") == 0, op, "QG_ATTENTION_DETERMINISTIC = '", v, "' must be 0 or 1");
  return false;
}

}  // namespace qg
