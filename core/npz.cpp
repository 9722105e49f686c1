#include "core/npz.h"

#include <zlib.h>

#include <algorithm>
#include <limits>

#include "core/file_io.h"
#include "core/npy.h"
#include "core/printable.h"

namespace qg {

namespace {

constexpr uint32_t kEndOfDirSig = 0x06054b50;
constexpr uint32_t kDirEntrySig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr size_t kEndOfDirSize = 22;
constexpr size_t kDirEntrySize = 46;
constexpr size_t kLocalSize = 30;
constexpr uint32_t kFull32 = 0xffffffffu;
// Deflate cannot expand data by more than about 1032:1; a larger claimed size is corrupt
// (and must not make us allocate it).
constexpr uint64_t kMaxInflateRatio = 1032;

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct Member {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0;
  uint64_t uncompressed = 0;
  uint64_t local_offset = 0;
};

// Replaces the 0xffffffff fields of a central-directory entry by their values from the
// ZIP64 extra field (id 1), which holds, in this order, only the fields that overflowed.
void apply_zip64_extra(const unsigned char* extra, size_t len, Member& m, const std::string& what) {
  size_t pos = 0;
  while (pos + 4 <= len) {
    const auto id = static_cast<uint16_t>(le(extra + pos, 2));
    const auto size = static_cast<size_t>(le(extra + pos + 2, 2));
    pos += 4;
    QG_CHECK(size <= len - pos, "npz", what, ": member '", printable(m.name), "': extra field of ",
             size, " bytes runs past its entry");
    if (id == 1) {
      size_t at = 0;
      for (uint64_t* field : {&m.uncompressed, &m.compressed, &m.local_offset}) {
        if (*field != kFull32) continue;
        QG_CHECK(at + 8 <= size, "npz", what, ": member '", printable(m.name),
                 "': ZIP64 extra field too short");
        *field = le(extra + pos + at, 8);
        at += 8;
      }
    }
    pos += size;
  }
  for (uint64_t field : {m.uncompressed, m.compressed, m.local_offset}) {
    QG_CHECK(field != kFull32, "npz", what, ": member '", printable(m.name),
             "': ZIP64 size or offset without a ZIP64 extra field");
  }
}

std::vector<Member> read_directory(std::string_view bytes, const std::string& what) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  QG_CHECK(size >= kEndOfDirSize, "npz", what, ": file too short (", size,
           " bytes) for a ZIP archive");
  // The end-of-central-directory record is the last 22 bytes plus a comment of <= 65535.
  size_t eocd = std::string_view::npos;
  const size_t lowest = size - kEndOfDirSize > 0xffff ? size - kEndOfDirSize - 0xffff : 0;
  for (size_t pos = size - kEndOfDirSize + 1; pos-- > lowest;) {
    if (le(p + pos, 4) == kEndOfDirSig && pos + kEndOfDirSize + le(p + pos + 20, 2) <= size) {
      eocd = pos;
      break;
    }
  }
  QG_CHECK(eocd != std::string_view::npos, "npz", what,
           ": no ZIP end-of-central-directory record (not an .npz file, or truncated)");
  const unsigned char* e = p + eocd;
  const auto disk = le(e + 4, 2), dir_disk = le(e + 6, 2);
  const auto count_here = le(e + 8, 2), count = le(e + 10, 2);
  const uint64_t dir_size = le(e + 12, 4), dir_offset = le(e + 16, 4);
  QG_CHECK(count != 0xffff && dir_size != kFull32 && dir_offset != kFull32, "npz", what,
           ": ZIP64 end of central directory not supported (", count, " members, directory of ",
           dir_size, " bytes at ", dir_offset, ")");
  QG_CHECK(disk == 0 && dir_disk == 0 && count_here == count, "npz", what,
           ": multi-disk ZIP archives are not supported");
  QG_CHECK(dir_offset <= eocd && dir_size <= eocd - dir_offset, "npz", what,
           ": central directory [", dir_offset, ", +", dir_size, ") runs past its end record at ",
           eocd);
  QG_CHECK(count * kDirEntrySize <= dir_size, "npz", what, ": ", count,
           " members cannot fit a central directory of ", dir_size, " bytes");

  std::vector<Member> members;
  size_t pos = dir_offset;
  const size_t dir_end = dir_offset + dir_size;
  for (uint64_t i = 0; i < count; ++i) {
    QG_CHECK(dir_end - pos >= kDirEntrySize && le(p + pos, 4) == kDirEntrySig, "npz", what,
             ": central directory entry ", i, " at offset ", pos, " is corrupt");
    const unsigned char* d = p + pos;
    const size_t name_len = le(d + 28, 2), extra_len = le(d + 30, 2), comment_len = le(d + 32, 2);
    QG_CHECK(name_len + extra_len + comment_len <= dir_end - pos - kDirEntrySize, "npz", what,
             ": central directory entry ", i, " runs past the directory");
    Member m;
    m.name.assign(reinterpret_cast<const char*>(d + kDirEntrySize), name_len);
    m.flags = static_cast<uint16_t>(le(d + 8, 2));
    m.method = static_cast<uint16_t>(le(d + 10, 2));
    m.crc = static_cast<uint32_t>(le(d + 16, 4));
    m.compressed = le(d + 20, 4);
    m.uncompressed = le(d + 24, 4);
    m.local_offset = le(d + 42, 4);
    apply_zip64_extra(d + kDirEntrySize + name_len, extra_len, m, what);
    members.push_back(std::move(m));
    pos += kDirEntrySize + name_len + extra_len + comment_len;
  }
  return members;
}

std::string inflate_member(const unsigned char* src, const Member& m, const std::string& what) {
  std::string out(m.uncompressed, '\0');
  z_stream zs{};
  QG_CHECK(inflateInit2(&zs, -MAX_WBITS) == Z_OK, "npz", what, ": zlib initialisation failed");
  uint64_t in_left = m.compressed, out_left = m.uncompressed;
  zs.next_in = const_cast<Bytef*>(src);
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  int rc = Z_OK;
  constexpr uint64_t kChunk = 1u << 30;  // zlib counts in 32-bit uInt
  while (rc == Z_OK) {
    if (zs.avail_in == 0 && in_left > 0) {
      zs.avail_in = static_cast<uInt>(std::min(in_left, kChunk));
      in_left -= zs.avail_in;
    }
    if (zs.avail_out == 0 && out_left > 0) {
      zs.avail_out = static_cast<uInt>(std::min(out_left, kChunk));
      out_left -= zs.avail_out;
    }
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_BUF_ERROR && (zs.avail_in == 0 && in_left == 0)) break;    // input ran out
    if (rc == Z_BUF_ERROR && (zs.avail_out == 0 && out_left == 0)) break;  // output full
  }
  const uint64_t produced = m.uncompressed - out_left - zs.avail_out;
  const std::string msg = zs.msg ? zs.msg : "";
  inflateEnd(&zs);
  QG_CHECK(rc == Z_STREAM_END, "npz", what, ": member '", printable(m.name),
           "': deflate data is corrupt or does not inflate to the recorded ", m.uncompressed,
           " bytes (zlib: ", rc, " ", printable(msg), ", ", produced, " bytes out)");
  QG_CHECK(produced == m.uncompressed, "npz", what, ": member '", printable(m.name),
           "': inflates to ", produced, " bytes, the directory records ", m.uncompressed);
  return out;
}

uint32_t crc_of(const std::string& s) {
  uLong c = crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(s.data());
  for (size_t left = s.size(); left > 0;) {
    const auto n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    c = crc32(c, p, n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(c);
}

}  // namespace

std::map<std::string, Tensor> parse_npz(std::string_view bytes, const std::string& what) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::vector<Member> members = read_directory(bytes, what);
  std::map<std::string, Tensor> out;
  for (const Member& m : members) {
    const std::string pname = printable(m.name);
    const std::string suffix = ".npy";
    QG_CHECK(m.name.size() > suffix.size() &&
                 m.name.compare(m.name.size() - suffix.size(), suffix.size(), suffix) == 0,
             "npz", what, ": member '", pname, "' is not a .npy file");
    const std::string key = m.name.substr(0, m.name.size() - suffix.size());
    QG_CHECK(!out.count(key), "npz", what, ": duplicate member '", pname, "'");
    QG_CHECK((m.flags & 1) == 0, "npz", what, ": member '", pname, "' is encrypted");
    QG_CHECK(m.method == 0 || m.method == 8, "npz", what, ": member '", pname,
             "': compression method ", m.method, " is not supported (stored 0 or deflate 8)");
    // The local header repeats the name and has its own extra field; its sizes may be zero
    // or 0xffffffff (numpy forces ZIP64 there), so only its lengths are used.
    QG_CHECK(m.local_offset <= bytes.size() && bytes.size() - m.local_offset >= kLocalSize &&
                 le(p + m.local_offset, 4) == kLocalSig,
             "npz", what, ": member '", pname, "': no local header at offset ", m.local_offset,
             " (file of ", bytes.size(), " bytes)");
    const unsigned char* local = p + m.local_offset;
    const uint64_t start = m.local_offset + kLocalSize + le(local + 26, 2) + le(local + 28, 2);
    QG_CHECK(start <= bytes.size() && m.compressed <= bytes.size() - start, "npz", what,
             ": member '", pname, "': data [", start, ", +", m.compressed,
             ") runs past the end of the file (", bytes.size(), " bytes)");
    std::string data;
    if (m.method == 0) {
      QG_CHECK(m.compressed == m.uncompressed, "npz", what, ": stored member '", pname,
               "' has compressed size ", m.compressed, " != uncompressed size ", m.uncompressed);
      data.assign(bytes.data() + start, m.compressed);
    } else {
      QG_CHECK(m.uncompressed <= m.compressed * kMaxInflateRatio + 1024, "npz", what, ": member '",
               pname, "': ", m.compressed, " compressed bytes cannot inflate to ", m.uncompressed);
      data = inflate_member(p + start, m, what);
    }
    const uint32_t crc = crc_of(data);
    QG_CHECK(crc == m.crc, "npz", what, ": member '", pname, "': CRC-32 mismatch (recorded ", m.crc,
             ", computed ", crc, ")");
    out.emplace(key, parse_npy(data, what + ":" + pname));
  }
  return out;
}

std::map<std::string, Tensor> load_npz(const std::string& path) {
  return parse_npz(read_file_bytes(path, "npz"), path);
}

}  // namespace qg
