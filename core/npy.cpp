#include "core/npy.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>

namespace qg {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// NumPy aligns the start of the data to 64 bytes; readers must not rely on it, we do it
// so files we write are byte-identical in layout to np.save's.
constexpr size_t kAlign = 64;

struct DescrEntry {
  const char* descr;
  DType dtype;
};
// Single-byte types have no byte order: NumPy writes '|', but '<' and '=' mean the same.
constexpr DescrEntry kDescrs[] = {
    {"<f4", DType::f32},     {"<f8", DType::f64},    {"<f2", DType::f16}, {"<i4", DType::i32},
    {"<i8", DType::i64},     {"|i1", DType::i8},     {"<i1", DType::i8},  {"=i1", DType::i8},
    {"|u1", DType::u8},      {"<u1", DType::u8},     {"=u1", DType::u8},  {"|b1", DType::boolean},
    {"<b1", DType::boolean}, {"=b1", DType::boolean}};

// A tiny parser for the header: a Python dict literal with the keys 'descr' (a string),
// 'fortran_order' (True/False) and 'shape' (a tuple of non-negative ints).
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran, Shape& shape) {
    std::map<std::string, bool> seen;
    skip_ws();
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        descr = parse_string();
      } else if (key == "fortran_order") {
        fortran = parse_bool();
      } else if (key == "shape") {
        shape = parse_tuple();
      } else {
        fail("unexpected key '" + key + "'");
      }
      if (seen[key]) fail("duplicate key '" + key + "'");
      seen[key] = true;
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++pos_;
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the dict");
    for (const char* k : {"descr", "fortran_order", "shape"}) {
      if (!seen[k]) fail(std::string("missing key '") + k + "'");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    QG_FAIL("npy", path_, ": malformed header (", what, " at offset ", pos_, "): ", s_);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    size_t end = s_.find(q, pos_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }
  bool parse_bool() {
    if (s_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  Shape parse_tuple() {
    Shape shape;
    bool comma = false;
    expect('(');
    while (true) {
      skip_ws();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a dimension");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        int d = peek() - '0';
        if (v > (std::numeric_limits<int64_t>::max() - d) / 10) fail("dimension overflows int64");
        v = v * 10 + d;
        ++pos_;
      }
      // Python writes 3L for longs in old files.
      if (peek() == 'L') ++pos_;
      shape.push_back(v);
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        comma = true;
        continue;
      }
      if (peek() != ')') fail("expected ',' or ')' in the shape");
    }
    // A one-element tuple needs its trailing comma in Python; "(3)" is an int, not a shape.
    if (shape.size() == 1 && !comma) fail("shape '(n)' is not a tuple; expected '(n,)'");
    ++pos_;
    return shape;
  }

  const std::string& s_;
  const std::string& path_;
  size_t pos_ = 0;
};

DType dtype_from_descr(const std::string& descr, const std::string& path) {
  for (const auto& e : kDescrs) {
    if (descr == e.descr) return e.dtype;
  }
  std::string why = "unsupported dtype '" + descr + "'";
  if (!descr.empty() && descr[0] == '>') why += " (big-endian data is not supported)";
  QG_FAIL("npy", path, ": ", why,
          "; supported: little-endian f32 '<f4', f64 '<f8', f16 '<f2', i8 '|i1', u8 '|u1', "
          "i32 '<i4', i64 '<i8', bool '|b1'");
}

uint64_t read_le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::string npy_descr(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::f16:
      return "<f2";
    case DType::i8:
      return "|i1";
    case DType::u8:
      return "|u1";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    case DType::boolean:
      return "|b1";
    case DType::bf16:
      break;
  }
  QG_FAIL("npy", "NumPy has no ", dtype_name(dtype), " dtype; cast the tensor to f32 first");
}

Tensor load_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QG_CHECK(in.good(), "npy", path, ": cannot open for reading (", std::strerror(errno), ")");
  unsigned char pre[kMagicLen + 2];
  in.read(reinterpret_cast<char*>(pre), sizeof(pre));
  QG_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof(pre)), "npy", path,
           ": file too short for a .npy preamble (", in.gcount(), " bytes)");
  QG_CHECK(std::memcmp(pre, kMagic, kMagicLen) == 0, "npy", path,
           ": bad magic string (not a .npy file)");
  const int major = pre[kMagicLen];
  const int minor = pre[kMagicLen + 1];
  QG_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, "npy", path,
           ": unsupported format version ", major, ".", minor, " (expected 1.0, 2.0 or 3.0)");
  const int len_bytes = major == 1 ? 2 : 4;
  unsigned char len_buf[4];
  in.read(reinterpret_cast<char*>(len_buf), len_bytes);
  QG_CHECK(in.gcount() == len_bytes, "npy", path, ": truncated header length field");
  const uint64_t header_len = read_le(len_buf, len_bytes);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  QG_CHECK(static_cast<uint64_t>(in.gcount()) == header_len, "npy", path,
           ": truncated header (expected ", header_len, " bytes, got ", in.gcount(), ")");

  std::string descr;
  bool fortran = false;
  Shape shape;
  HeaderParser(header, path).parse(descr, fortran, shape);
  const DType dtype = dtype_from_descr(descr, path);
  QG_CHECK(!fortran, "npy", path,
           ": Fortran-order arrays are not supported (save with np.ascontiguousarray)");
  int64_t numel = 1;
  for (int64_t d : shape) {
    QG_CHECK(d == 0 || numel <= std::numeric_limits<int64_t>::max() / d / 8, "npy", path,
             ": shape ", shape_str(shape), " is too large");
    numel *= d;
  }

  Tensor t = Tensor::empty(shape, dtype);
  const auto want = static_cast<std::streamsize>(t.nbytes());
  if (want > 0) in.read(static_cast<char*>(t.raw_data()), want);
  const std::streamsize got = want > 0 ? in.gcount() : 0;
  QG_CHECK(got == want, "npy", path, ": truncated data: shape ", shape_str(shape), " of ",
           dtype_name(dtype), " needs ", want, " bytes, the file has ", got);
  in.peek();
  QG_CHECK(in.eof(), "npy", path, ": shape/data size mismatch: shape ", shape_str(shape), " of ",
           dtype_name(dtype), " needs ", want, " bytes but the file has more data");
  if (dtype == DType::boolean) {
    // Normalise to 0/1 so a stray byte cannot produce an invalid C++ bool.
    auto* p = static_cast<unsigned char*>(t.raw_data());
    for (int64_t i = 0; i < numel; ++i) p[i] = p[i] != 0;
  }
  return t;
}

void save_npy(const std::string& path, const Tensor& tensor) {
  QG_CHECK(tensor.defined(), "npy", path, ": cannot save an undefined tensor");
  const Tensor host = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
  QG_CHECK(host.is_contiguous(), "npy", path, ": cannot save a non-contiguous tensor");
  std::string dict =
      "{'descr': '" + npy_descr(host.dtype()) + "', 'fortran_order': False, " + "'shape': (";
  for (size_t i = 0; i < host.shape().size(); ++i) {
    dict += std::to_string(host.shape()[i]);
    dict += host.shape().size() == 1 ? "," : (i + 1 < host.shape().size() ? ", " : "");
  }
  dict += "), }";

  // Version 1.0 stores the header length in 2 bytes; larger headers need 2.0 (4 bytes).
  int major = 1;
  size_t prefix = kMagicLen + 2 + 2;
  if (prefix + dict.size() + 1 > 65535) {
    major = 2;
    prefix = kMagicLen + 2 + 4;
  }
  size_t total = prefix + dict.size() + 1;
  size_t padded = (total + kAlign - 1) / kAlign * kAlign;
  dict.append(padded - total, ' ');
  dict.push_back('\n');
  const uint64_t header_len = dict.size();

  std::string out;
  out.append(kMagic, kMagicLen);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) {
    out.push_back(static_cast<char>((header_len >> (8 * i)) & 0xff));
  }
  out += dict;

  static std::atomic<int> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  QG_CHECK(f != nullptr, "npy", path, ": cannot open '", tmp, "' for writing (",
           std::strerror(errno), ")");
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (ok && host.nbytes() > 0) {
    ok = std::fwrite(host.raw_data(), 1, host.nbytes(), f) == host.nbytes();
  }
  const int saved_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    QG_FAIL("npy", path, ": write failed (", std::strerror(saved_errno), ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    QG_FAIL("npy", path, ": cannot rename the temporary file into place (", std::strerror(e), ")");
  }
}

}  // namespace qg
