// Bytes read from a file may be anything: before they go into error text, make them safe to
// print (a corrupt header must not put control characters or invalid UTF-8 on a terminal or
// into a log) and short (a megabyte of garbage is not a useful message).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qg {

/// `bytes` with every byte outside printable ASCII (0x20..0x7e) and the backslash written as
/// \xNN, cut after `max_bytes` input bytes with a note saying how many were left out.
inline std::string printable(std::string_view bytes, size_t max_bytes = 160) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = bytes.size() < max_bytes ? bytes.size() : max_bytes;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c <= 0x7e && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  if (n < bytes.size()) out += "... (" + std::to_string(bytes.size() - n) + " more bytes)";
  return out;
}

}  // namespace qg
