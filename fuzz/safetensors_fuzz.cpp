// libFuzzer target: the safetensors reader on arbitrary bytes. Only qg::Error may escape it,
// and whatever it accepts must survive a write and a second read unchanged.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, qg::Tensor> tensors;
  std::map<std::string, std::string> meta;
  try {
    tensors = qg::parse_safetensors(std::string_view(reinterpret_cast<const char*>(data), size),
                                    "fuzz", &meta);
  } catch (const qg::Error&) {
    return 0;
  }
  std::map<std::string, std::string> meta2;
  const auto again = qg::parse_safetensors(qg::encode_safetensors(tensors, meta), "again", &meta2);
  if (again.size() != tensors.size() || meta2 != meta) __builtin_trap();
  for (const auto& [name, t] : tensors) {
    const qg::Tensor& u = again.at(name);
    if (u.dtype() != t.dtype() || u.shape() != t.shape() ||
        (t.nbytes() > 0 && std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) != 0)) {
      __builtin_trap();
    }
  }
  return 0;
}
