#include "core/npy.h"

#include <cctype>
#include <cstring>
#include <limits>
#include <map>

#include "core/file_io.h"
#include "core/printable.h"

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
        fail("unexpected key '" + printable(key) + "'");
      }
      if (seen[key]) fail("duplicate key '" + printable(key) + "'");
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
    QG_FAIL("npy", path_, ": malformed header (", what, " at offset ", pos_, "): ", printable(s_));
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
  std::string why = "unsupported dtype '" + printable(descr) + "'";
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

Tensor parse_npy(std::string_view bytes, const std::string& what) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  QG_CHECK(size >= kMagicLen + 2, "npy", what, ": file too short for a .npy preamble (", size,
           " bytes)");
  QG_CHECK(std::memcmp(p, kMagic, kMagicLen) == 0, "npy", what,
           ": bad magic string (not a .npy file)");
  const int major = p[kMagicLen];
  const int minor = p[kMagicLen + 1];
  QG_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, "npy", what,
           ": unsupported format version ", major, ".", minor, " (expected 1.0, 2.0 or 3.0)");
  const size_t len_bytes = major == 1 ? 2 : 4;
  size_t pos = kMagicLen + 2;
  QG_CHECK(size - pos >= len_bytes, "npy", what, ": truncated header length field");
  const uint64_t header_len = read_le(p + pos, static_cast<int>(len_bytes));
  pos += len_bytes;
  QG_CHECK(header_len <= size - pos, "npy", what, ": truncated header (expected ", header_len,
           " bytes, got ", size - pos, ")");
  const std::string header(bytes.substr(pos, header_len));
  pos += header_len;

  std::string descr;
  bool fortran = false;
  Shape shape;
  HeaderParser(header, what).parse(descr, fortran, shape);
  const DType dtype = dtype_from_descr(descr, what);
  QG_CHECK(!fortran, "npy", what,
           ": Fortran-order arrays are not supported (save with np.ascontiguousarray)");
  // The product of the non-zero dimensions must fit too: a tensor's strides are computed
  // from it even when another dimension is 0 (the shape (0, 2**32, 2**32) holds no data).
  int64_t numel = 1, extent = 1;
  for (int64_t d : shape) {
    QG_CHECK(d == 0 || extent <= std::numeric_limits<int64_t>::max() / d / 8, "npy", what,
             ": shape ", shape_str(shape), " is too large");
    numel *= d;
    if (d != 0) extent *= d;
  }
  // Check the size before allocating: a corrupt shape must not reserve gigabytes.
  const uint64_t want = static_cast<uint64_t>(numel) * dtype_size(dtype);
  const size_t have = size - pos;
  QG_CHECK(have >= want, "npy", what, ": truncated data: shape ", shape_str(shape), " of ",
           dtype_name(dtype), " needs ", want, " bytes, the file has ", have);
  QG_CHECK(have == want, "npy", what, ": shape/data size mismatch: shape ", shape_str(shape),
           " of ", dtype_name(dtype), " needs ", want, " bytes but the file has more data");

  Tensor t = Tensor::empty(shape, dtype);
  if (want > 0) std::memcpy(t.raw_data(), p + pos, want);
  if (dtype == DType::boolean) {
    // Normalise to 0/1 so a stray byte cannot produce an invalid C++ bool.
    auto* b = static_cast<unsigned char*>(t.raw_data());
    for (int64_t i = 0; i < numel; ++i) b[i] = b[i] != 0;
  }
  return t;
}

Tensor load_npy(const std::string& path) {
  return parse_npy(read_file_bytes(path, "npy"), path);
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

  write_file_replacing(path, "npy", {{out.data(), out.size()}, {host.raw_data(), host.nbytes()}});
}

}  // namespace qg
