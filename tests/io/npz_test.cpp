// .npz reading: files from numpy.savez and numpy.savez_compressed, and one qg::Error per kind
// of damaged archive (each from an archive built here, stored or deflated, then corrupted at
// a known offset).
#include "core/npz.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/npy.h"
#include "io_test_util.h"

namespace qg {
namespace {

using io_test::error_of;

void put(std::string& s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string deflate_raw(const std::string& in) {
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, in.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

struct ZipMember {
  std::string name;
  std::string data;  // uncompressed
  bool deflate = false;
  bool zip64 = false;  // directory sizes as 0xffffffff plus a ZIP64 extra field
};

// A minimal ZIP archive (local headers, central directory, end record), as zipfile writes.
std::string make_zip(const std::vector<ZipMember>& members) {
  std::string out, dir;
  for (const auto& m : members) {
    const std::string body = m.deflate ? deflate_raw(m.data) : m.data;
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(m.data.data()), static_cast<uInt>(m.data.size())));
    const uint64_t offset = out.size();
    put(out, 0x04034b50, 4);
    put(out, 20, 2);
    put(out, 0, 2);
    put(out, m.deflate ? 8 : 0, 2);
    put(out, 0, 4);  // time, date
    put(out, crc, 4);
    put(out, body.size(), 4);
    put(out, m.data.size(), 4);
    put(out, m.name.size(), 2);
    put(out, 0, 2);
    out += m.name + body;
    put(dir, 0x02014b50, 4);
    put(dir, 20, 2);
    put(dir, 20, 2);
    put(dir, 0, 2);
    put(dir, m.deflate ? 8 : 0, 2);
    put(dir, 0, 4);
    put(dir, crc, 4);
    put(dir, m.zip64 ? 0xffffffff : body.size(), 4);
    put(dir, m.zip64 ? 0xffffffff : m.data.size(), 4);
    put(dir, m.name.size(), 2);
    put(dir, m.zip64 ? 20 : 0, 2);  // extra field length
    put(dir, 0, 6);                 // comment, disk, internal attrs
    put(dir, 0, 4);                 // external attrs
    put(dir, offset, 4);
    dir += m.name;
    if (m.zip64) {
      put(dir, 1, 2);
      put(dir, 16, 2);
      put(dir, m.data.size(), 8);
      put(dir, body.size(), 8);
    }
  }
  const uint64_t dir_offset = out.size();
  out += dir;
  put(out, 0x06054b50, 4);
  put(out, 0, 4);
  put(out, members.size(), 2);
  put(out, members.size(), 2);
  put(out, dir.size(), 4);
  put(out, dir_offset, 4);
  put(out, 0, 2);
  return out;
}

// The .npy bytes of a tensor, through save_npy.
std::string npy_bytes(const Tensor& t) {
  const std::string path = io_test::temp_path("member.npy");
  save_npy(path, t);
  std::string b = io_test::read_bytes(path);
  std::remove(path.c_str());
  return b;
}

std::string npz_error(const std::string& bytes) {
  return error_of([&] { parse_npz(bytes, "bad.npz"); });
}

std::string two_members(bool deflate) {
  return make_zip(
      {{"x.npy", npy_bytes(Tensor::from_doubles({2, 2}, {1, 2, 3, 4})), deflate},
       {"y.npy", npy_bytes(Tensor::from_doubles({3}, {5, 6, 7}, DType::i64)), deflate}});
}

TEST(Npz, ReadsStoredAndDeflatedArchivesBuiltHere) {
  for (bool deflate : {false, true}) {
    auto m = parse_npz(two_members(deflate), "ok.npz");
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m.at("x").shape(), (Shape{2, 2}));
    EXPECT_EQ(m.at("x").data<float>()[3], 4.0f);
    EXPECT_EQ(m.at("y").data<int64_t>()[2], 7);
  }
}

TEST(Npz, ReadsZip64SizesFromTheExtraField) {
  const std::string x = npy_bytes(Tensor::from_doubles({3}, {1, 2, 3}));
  auto m = parse_npz(make_zip({{"x.npy", x, true, true}, {"y.npy", x, false, true}}), "ok.npz");
  EXPECT_EQ(m.at("x").data<float>()[2], 3.0f);
  EXPECT_EQ(m.at("y").data<float>()[0], 1.0f);
  std::string zip = make_zip({{"x.npy", x, false, true}});
  zip[zip.size() - 22 - 20 + 2] = 8;  // the extra field claims 8 bytes: one size missing
  std::string e = npz_error(zip);
  EXPECT_NE(e.find("member 'x.npy': ZIP64 extra field too short"), std::string::npos) << e;
}

TEST(Npz, ReadsNumpySavezAndSavezCompressed) {
  if (!io_test::reference_python_available())
    GTEST_SKIP() << io_test::kPython << " with numpy and torch is not installed";
  const std::string dir = io_test::temp_path("npz_ref");
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  ASSERT_EQ(io_test::run_reference_script("write " + dir), 0);
  for (const char* file : {"/ref.npz", "/ref_z.npz"}) {
    SCOPED_TRACE(file);
    auto m = load_npz(dir + file);
    ASSERT_EQ(m.size(), 5u);
    EXPECT_EQ(m.at("a").shape(), (Shape{2, 3}));
    EXPECT_EQ(m.at("a").data<float>()[5], 5.0f);
    EXPECT_EQ(m.at("b").dtype(), DType::i64);
    EXPECT_EQ(m.at("b").data<int64_t>()[2], int64_t{1} << 40);
    EXPECT_EQ(m.at("c").dtype(), DType::f16);
    EXPECT_EQ(m.at("mask").dtype(), DType::boolean);
    EXPECT_EQ(m.at("zeros").shape(), (Shape{40, 25}));
    EXPECT_EQ(m.at("zeros").dtype(), DType::f64);
  }
  EXPECT_LT(io_test::read_bytes(dir + "/ref_z.npz").size(),
            io_test::read_bytes(dir + "/ref.npz").size());
}

TEST(Npz, NotAZipOrTruncated) {
  std::string e = npz_error("short");
  EXPECT_NE(e.find("bad.npz: file too short (5 bytes)"), std::string::npos) << e;
  e = npz_error(std::string(100, 'z'));
  EXPECT_NE(e.find("no ZIP end-of-central-directory record"), std::string::npos) << e;
  const std::string zip = two_members(false);
  // Cut into the data: the end record is gone.
  e = npz_error(zip.substr(0, zip.size() - 30));
  EXPECT_NE(e.find("end-of-central-directory"), std::string::npos) << e;
}

TEST(Npz, DirectoryOffsetsAndSizesAreChecked) {
  const std::string zip = two_members(false);
  const size_t eocd = zip.size() - 22;
  std::string bad = zip;
  bad.replace(eocd + 16, 4, std::string("\xf0\xff\xff\x0f", 4));  // directory offset
  std::string e = npz_error(bad);
  EXPECT_NE(e.find("central directory [268435440"), std::string::npos) << e;
  bad = zip;
  bad.replace(eocd + 10, 2, std::string("\xff\xff", 2));
  e = npz_error(bad);
  EXPECT_NE(e.find("ZIP64 end of central directory not supported"), std::string::npos) << e;
  bad = zip;
  bad.replace(eocd + 8, 2, std::string("\x09\x00", 2));
  bad.replace(eocd + 10, 2, std::string("\x09\x00", 2));
  e = npz_error(bad);
  EXPECT_NE(e.find("9 members cannot fit"), std::string::npos) << e;
  // The first member's local-header offset (directory entry byte 42) past the end.
  const size_t dir = zip.size() - 22 - 2 * (46 + 5);
  bad = zip;
  bad.replace(dir + 42, 4, std::string("\x00\x00\x01\x00", 4));
  e = npz_error(bad);
  EXPECT_NE(e.find("member 'x.npy': no local header at offset 65536"), std::string::npos) << e;
  // Its compressed size (byte 20) past the end of the file.
  bad = zip;
  bad.replace(dir + 20, 4, std::string("\x00\x00\x01\x00", 4));
  e = npz_error(bad);
  EXPECT_NE(e.find("member 'x.npy': data ["), std::string::npos) << e;
  EXPECT_NE(e.find("runs past the end of the file"), std::string::npos) << e;
  // A ZIP64 size with no ZIP64 extra field.
  bad = zip;
  bad.replace(dir + 24, 4, std::string("\xff\xff\xff\xff", 4));
  e = npz_error(bad);
  EXPECT_NE(e.find("ZIP64 size or offset without a ZIP64 extra field"), std::string::npos) << e;
}

TEST(Npz, MemberContentsAreChecked) {
  std::string zip = two_members(false);
  // The last data byte of x.npy (after the 30-byte local header and the 5-byte name).
  zip[30 + 5 + npy_bytes(Tensor::from_doubles({2, 2}, {1, 2, 3, 4})).size() - 1] ^= 1;
  std::string e = npz_error(zip);
  EXPECT_NE(e.find("member 'x.npy': CRC-32 mismatch"), std::string::npos) << e;

  zip = two_members(true);
  const size_t dir = zip.size() - 22 - 2 * (46 + 5);
  std::string bad = zip;
  bad.replace(dir + 24, 4, std::string("\x00\x10\x00\x00", 4));  // uncompressed size 4096
  e = npz_error(bad);
  EXPECT_NE(e.find("member 'x.npy': inflates to 144 bytes, the directory records 4096"),
            std::string::npos)
      << e;
  bad = zip;
  bad.replace(dir + 24, 4, std::string("\x0a\x00\x00\x00", 4));  // 10
  e = npz_error(bad);
  EXPECT_NE(e.find("member 'x.npy': deflate data is corrupt or does not inflate to the recorded "
                   "10 bytes"),
            std::string::npos)
      << e;
  bad = zip;
  bad.replace(dir + 24, 4, std::string("\x00\x00\x00\x7f", 4));  // 2 GiB from a few bytes
  e = npz_error(bad);
  EXPECT_NE(e.find("compressed bytes cannot inflate to 2130706432"), std::string::npos) << e;
  bad = zip;
  bad[30 + 5] = '\xff';  // an invalid deflate block type
  e = npz_error(bad);
  EXPECT_NE(e.find("deflate data is corrupt"), std::string::npos) << e;

  e = npz_error(make_zip({{"notes.txt", "hello"}}));
  EXPECT_NE(e.find("member 'notes.txt' is not a .npy file"), std::string::npos) << e;
  e = npz_error(make_zip({{"a.npy", npy_bytes(Tensor::scalar(1))}, {"a.npy", "x"}}));
  EXPECT_NE(e.find("duplicate member 'a.npy'"), std::string::npos) << e;
  e = npz_error(make_zip({{"a.npy", "not npy at all"}}));
  EXPECT_NE(e.find("bad.npz:a.npy: bad magic string"), std::string::npos) << e;
  e = npz_error(make_zip({{std::string("\x1b[2J\x01.npy", 9), "hello"}}));
  EXPECT_NE(e.find("bad.npz:\\x1b[2J\\x01.npy: file too short"), std::string::npos) << e;
  EXPECT_TRUE(io_test::all_printable(e)) << e;
}

}  // namespace
}  // namespace qg
