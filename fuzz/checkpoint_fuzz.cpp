// libFuzzer target: the checkpoint container and tensor-payload decoders on arbitrary bytes
// (what Trainer::load_checkpoint_bytes runs before it looks at the model). Only qg::Error may
// escape them. Random mutations almost never keep the CRC-32s right, so each input is also
// decoded with its checksums recomputed, to reach the section parsing behind them.
#include <zlib.h>

#include <cstdint>
#include <string>

#include "train/checkpoint.h"

namespace {

uint64_t get(const std::string& b, size_t pos, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[pos + i]);
  return v;
}

void set32(std::string& b, size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[pos + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t crc(const std::string& b, size_t pos, size_t n) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(b.data() + pos), static_cast<uInt>(n)));
}

// Walks the layout of train/checkpoint.h as far as it holds and rewrites every section CRC and
// the trailer to match the bytes.
std::string with_fixed_checksums(std::string b) {
  if (b.size() < 8 + 12) return b;
  const size_t body = b.size() - 4;
  size_t pos = 16;
  for (uint64_t i = 0, count = get(b, 12, 4); i < count && pos + 4 <= body; ++i) {
    const uint64_t name_len = get(b, pos, 4);
    if (name_len > body - pos - 4) break;
    pos += 4 + name_len;
    if (body - pos < 12) break;
    const uint64_t len = get(b, pos, 8);
    if (len > body - pos - 12) break;
    set32(b, pos + 8, crc(b, pos + 12, len));
    pos += 12 + len;
  }
  set32(b, body, crc(b, 0, body));
  return b;
}

void decode(const std::string& bytes) {
  try {
    for (const auto& section : qg::nn::decode_checkpoint(bytes, "fuzz")) {
      try {
        qg::nn::decode_tensor(section.payload, "fuzz");
      } catch (const qg::Error&) {
      }
    }
  } catch (const qg::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  decode(bytes);
  decode(with_fixed_checksums(bytes));
  // Tensor payloads on their own, without the container around them.
  try {
    qg::nn::decode_tensor(bytes, "fuzz");
  } catch (const qg::Error&) {
  }
  return 0;
}
