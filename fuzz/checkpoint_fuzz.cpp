// libFuzzer target: the checkpoint container and tensor-payload decoders on arbitrary bytes
// (what Trainer::load_checkpoint_bytes runs before it looks at the model). Only qg::Error may
// escape them.
#include <cstdint>
#include <string>

#include "nn/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& section : qg::nn::decode_checkpoint(bytes, "fuzz")) {
      try {
        qg::nn::decode_tensor(section.payload, "fuzz");
      } catch (const qg::Error&) {
      }
    }
  } catch (const qg::Error&) {
  }
  // Tensor payloads on their own, without the container's checksums in the way.
  try {
    qg::nn::decode_tensor(bytes, "fuzz");
  } catch (const qg::Error&) {
  }
  return 0;
}
