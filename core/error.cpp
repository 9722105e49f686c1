#include "core/error.h"

namespace qg {

namespace {
std::string format(const std::string& op, const std::string& message, const char* file, int line) {
  std::string where = file;
  // Keep only the repository-relative part of the path so messages do not leak build paths:
  // from the top-level folder that starts earliest (tests/nn/x.cpp stays tests/nn/x.cpp).
  size_t cut = std::string::npos;
  for (const char* root : {"/core/", "/ops/", "/autograd/", "/runtime/", "/nn/", "/export/",
                           "/apps/", "/bench/", "/tests/"}) {
    auto pos = where.rfind(root);
    if (pos != std::string::npos && (cut == std::string::npos || pos < cut)) cut = pos;
  }
  if (cut != std::string::npos) where = where.substr(cut + 1);
  return "[" + op + "] " + message + " (" + where + ":" + std::to_string(line) + ")";
}
}  // namespace

Error::Error(std::string op, std::string message, const char* file, int line)
    : std::runtime_error(format(op, message, file, line)),
      op_(std::move(op)),
      message_(std::move(message)) {}

}  // namespace qg
