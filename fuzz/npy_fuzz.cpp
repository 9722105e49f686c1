// libFuzzer target: the .npy parser on arbitrary bytes. Only qg::Error may escape it.
#include <cstdint>
#include <string_view>

#include "core/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qg::Tensor t =
        qg::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    if (t.nbytes() + 10 > size) __builtin_trap();  // every byte it holds came from the input
  } catch (const qg::Error&) {
  }
  return 0;
}
