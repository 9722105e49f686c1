// libFuzzer target: the .npz (ZIP) reader on arbitrary bytes. Only qg::Error may escape it.
#include <cstdint>
#include <string_view>

#include "core/npz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qg::parse_npz(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const qg::Error&) {
  }
  return 0;
}
