// libFuzzer target: the digits CSV parser on arbitrary text. Only qg::Error may escape it.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/digits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qg::nn::parse_digits_csv(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const qg::Error&) {
  }
  return 0;
}
