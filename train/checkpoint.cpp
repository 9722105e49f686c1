#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"
#include "core/printable.h"

namespace qg::nn {
namespace {

constexpr char kMagic[8] = {'Q', 'G', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr uint32_t kVersion = 1;

uint32_t crc32_of(const char* p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths; feed in chunks so huge payloads stay correct.
  while (n > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

template <typename T>
void put(std::string& out, T v) {
  unsigned char b[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i)
    b[i] = static_cast<unsigned char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}

// A bounds-checked little-endian reader: every read names the file and what was expected.
class Reader {
 public:
  Reader(const std::string& bytes, size_t end, const std::string& what)
      : b_(bytes), end_(end), what_(what) {}
  template <typename T>
  T get(const char* field) {
    need(sizeof(T), field);
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(b_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  std::string bytes(uint64_t n, const char* field) {
    need(n, field);
    std::string s = b_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return end_ - pos_; }

 private:
  void need(uint64_t n, const char* field) {
    QG_CHECK(n <= end_ - pos_, "checkpoint", what_, ": truncated or corrupt: ", field, " needs ", n,
             " bytes at offset ", pos_, " but only ", end_ - pos_, " remain");
  }
  const std::string& b_;
  size_t end_;
  const std::string& what_;
  size_t pos_ = 0;
};

}  // namespace

std::string encode_checkpoint(const std::vector<CheckpointSection>& sections) {
  std::string out(kMagic, sizeof kMagic);
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, static_cast<uint32_t>(sections.size()));
  for (const auto& s : sections) {
    put<uint32_t>(out, static_cast<uint32_t>(s.name.size()));
    out += s.name;
    put<uint64_t>(out, s.payload.size());
    put<uint32_t>(out, crc32_of(s.payload.data(), s.payload.size()));
    out += s.payload;
  }
  put<uint32_t>(out, crc32_of(out.data(), out.size()));
  return out;
}

std::vector<CheckpointSection> decode_checkpoint(const std::string& bytes,
                                                 const std::string& what) {
  QG_CHECK(bytes.size() >= sizeof kMagic + 12, "checkpoint", what, ": truncated (", bytes.size(),
           " bytes is smaller than the header and trailer)");
  QG_CHECK(std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0, "checkpoint", what,
           ": not a qatgraph checkpoint (bad magic)");
  size_t body = bytes.size() - 4;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i)
    stored |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[body + i])) << (8 * i);
  uint32_t actual = crc32_of(bytes.data(), body);
  QG_CHECK(stored == actual, "checkpoint", what, ": file checksum mismatch (stored ", stored,
           ", computed ", actual, "): the file is truncated or corrupt");
  Reader r(bytes, body, what);
  r.bytes(sizeof kMagic, "magic");
  uint32_t version = r.get<uint32_t>("version");
  QG_CHECK(version == kVersion, "checkpoint", what, ": format version ", version,
           " is not supported (expected ", kVersion, ")");
  uint32_t count = r.get<uint32_t>("section count");
  std::vector<CheckpointSection> out;
  for (uint32_t i = 0; i < count; ++i) {
    CheckpointSection s;
    uint32_t name_len = r.get<uint32_t>("section name length");
    s.name = r.bytes(name_len, "section name");
    uint64_t len = r.get<uint64_t>("section length");
    uint32_t crc = r.get<uint32_t>("section checksum");
    s.payload = r.bytes(len, "section payload");
    uint32_t got = crc32_of(s.payload.data(), s.payload.size());
    QG_CHECK(crc == got, "checkpoint", what, ": section '", printable(s.name),
             "' checksum mismatch (stored ", crc, ", computed ", got, ")");
    out.push_back(std::move(s));
  }
  QG_CHECK(r.left() == 0, "checkpoint", what, ": ", r.left(),
           " unexpected bytes after the last section");
  return out;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  // A "<path>.tmp" left by a write that was killed midway may be read-only, a link or a
  // directory entry of another owner: remove it and create a fresh file (O_EXCL, so a link
  // planted there is not followed).
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC, 0644);
  QG_CHECK(fd >= 0, "io", "cannot create '", tmp, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      QG_FAIL("io", "writing '", tmp, "' failed: ", std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  int e = errno;
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    QG_FAIL("io", "fsync of '", tmp, "' failed: ", std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int re = errno;
    ::unlink(tmp.c_str());
    QG_FAIL("io", "cannot rename '", tmp, "' to '", path, "': ", std::strerror(re));
  }
  // Make the rename itself durable.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_checkpoint(const std::string& path, const std::vector<CheckpointSection>& sections) {
  write_file_atomic(path, encode_checkpoint(sections));
}

std::vector<CheckpointSection> read_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  QG_CHECK(f.good(), "checkpoint", "cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return decode_checkpoint(bytes, path);
}

std::string encode_tensor(const Tensor& t) {
  Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  QG_CHECK(c.is_contiguous(), "checkpoint", "cannot store a non-contiguous tensor ", c.str());
  std::string out;
  put<uint8_t>(out, static_cast<uint8_t>(c.dtype()));
  put<uint8_t>(out, static_cast<uint8_t>(c.dim()));
  for (int64_t d : c.shape()) put<uint64_t>(out, static_cast<uint64_t>(d));
  out.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  return out;
}

Tensor decode_tensor(const std::string& payload, const std::string& what) {
  Reader r(payload, payload.size(), what);
  uint8_t dt = r.get<uint8_t>("tensor dtype");
  QG_CHECK(dt < kDTypeCount, "checkpoint", what, ": unknown dtype code ", int(dt));
  uint8_t rank = r.get<uint8_t>("tensor rank");
  QG_CHECK(rank <= 8, "checkpoint", what, ": tensor rank ", int(rank), " is implausible");
  Shape shape;
  // `extent`, the product of the non-zero dims, bounds the strides: a 0 elsewhere in the
  // shape must not let the other dims overflow them (a fuzzer found [0, 2^37, 2^37, ...]).
  uint64_t numel = 1, extent = 1;
  for (int i = 0; i < rank; ++i) {
    uint64_t d = r.get<uint64_t>("tensor dim");
    QG_CHECK(d <= (uint64_t{1} << 40) && (d == 0 || extent <= (uint64_t{1} << 40) / d),
             "checkpoint", what, ": tensor dim ", d, " is implausible");
    numel *= d;
    if (d != 0) extent *= d;
    shape.push_back(static_cast<int64_t>(d));
  }
  DType dtype = static_cast<DType>(dt);
  uint64_t want = numel * dtype_size(dtype);
  QG_CHECK(r.left() == want, "checkpoint", what, ": tensor ", dtype_name(dtype), shape_str(shape),
           " needs ", want, " data bytes, the section holds ", r.left());
  Tensor t = Tensor::empty(shape, dtype);
  if (want > 0) std::memcpy(t.raw_data(), payload.data() + r.pos(), want);
  return t;
}

CheckpointSections::CheckpointSections(const std::vector<CheckpointSection>& sections,
                                       std::string what)
    : what_(std::move(what)) {
  for (const CheckpointSection& s : sections)
    QG_CHECK(by_name_.emplace(s.name, &s.payload).second, "checkpoint", what_,
             ": duplicate section '", printable(s.name), "'");
}

const std::string& CheckpointSections::operator()(const std::string& name) const {
  auto it = by_name_.find(name);
  QG_CHECK(it != by_name_.end(), "checkpoint", what_, ": missing section '", name, "'");
  return *it->second;
}

std::map<std::string, std::string> CheckpointSections::meta() const {
  std::istringstream text((*this)("meta"));
  std::map<std::string, std::string> kv;
  for (std::string line; std::getline(text, line);) {
    const size_t sp = line.find(' ');
    QG_CHECK(sp != std::string::npos, "checkpoint", what_, ": malformed meta line '",
             printable(line), "'");
    kv[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return kv;
}

}  // namespace qg::nn
