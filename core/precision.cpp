#include "core/precision.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace qg {
namespace {

std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("QG_ALLOW_TF32");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }()};
  return flag;
}

}  // namespace

bool allow_tf32() {
  return tf32_flag().load(std::memory_order_relaxed);
}
void set_allow_tf32(bool on) {
  tf32_flag().store(on, std::memory_order_relaxed);
}

}  // namespace qg
