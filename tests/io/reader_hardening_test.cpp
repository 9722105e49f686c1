// Bugs found by hand in the existing readers and writers: file bytes echoed raw into error
// text (.npy, digits CSV), and a stale "<path>.tmp" left by a killed checkpoint write.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <string>

#include "core/npy.h"
#include "core/printable.h"
#include "data/digits.h"
#include "io_test_util.h"
#include "train/checkpoint.h"

namespace qg {
namespace {

using io_test::all_printable;
using io_test::error_of;

TEST(Printable, EscapesAndCaps) {
  EXPECT_EQ(printable("ab c~"), "ab c~");
  EXPECT_EQ(printable(std::string("a\x00\x1b\x7f\xff\\", 6)), "a\\x00\\x1b\\x7f\\xff\\x5c");
  EXPECT_EQ(printable(std::string(10, 'x'), 4), "xxxx... (6 more bytes)");
}

TEST(NpyErrors, CorruptHeaderIsEscapedAndCapped) {
  // A header with a terminal escape sequence, a NUL, invalid UTF-8, and 4000 bytes of junk.
  std::string dict = std::string("{'descr': '<f4', \x1b[31m\x00\xff", 24) + std::string(4000, 'j');
  std::string bytes("\x93NUMPY\x01\x00", 8);
  dict.push_back('\n');
  bytes.push_back(static_cast<char>(dict.size() & 0xff));
  bytes.push_back(static_cast<char>(dict.size() >> 8));
  bytes += dict;
  std::string e = error_of([&] { parse_npy(bytes, "bad.npy"); });
  EXPECT_NE(e.find("bad.npy: malformed header"), std::string::npos) << e;
  EXPECT_NE(e.find("\\x1b[31m\\x00\\xff"), std::string::npos) << e;
  EXPECT_NE(e.find("more bytes)"), std::string::npos) << e;
  EXPECT_TRUE(all_printable(e)) << e;
  EXPECT_LT(e.size(), 600u);
  // The descr string is echoed too.
  std::string d2 = "{'descr': '<\x01q', 'fortran_order': False, 'shape': (1,), }\n";
  std::string b2("\x93NUMPY\x01\x00", 8);
  b2.push_back(static_cast<char>(d2.size()));
  b2.push_back(0);
  e = error_of([&] { parse_npy(b2 + d2 + "abcd", "bad.npy"); });
  EXPECT_NE(e.find("unsupported dtype '<\\x01q'"), std::string::npos) << e;
}

TEST(NpyErrors, HugeShapeIsRejectedBeforeAllocating) {
  std::string d = "{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000, 1000), }\n";
  std::string b("\x93NUMPY\x01\x00", 8);
  b.push_back(static_cast<char>(d.size()));
  b.push_back(0);
  std::string e = error_of([&] { parse_npy(b + d, "big.npy"); });
  EXPECT_NE(e.find("truncated data: shape [100000, 100000, 1000] of f64 needs 80000000000000 "
                   "bytes, the file has 0"),
            std::string::npos)
      << e;
}

// Found by the checkpoint fuzzer: a zero dimension made every other dimension pass the size
// check, and Tensor::empty's strides then overflowed. The same shape in each reader:
TEST(ZeroSizedShapes, HugeOtherDimsAreRejected) {
  std::string d =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296), }\n";
  std::string b("\x93NUMPY\x01\x00", 8);
  b.push_back(static_cast<char>(d.size()));
  b.push_back(0);
  std::string e = error_of([&] { parse_npy(b + d, "z.npy"); });
  EXPECT_NE(e.find("z.npy: shape [0, 4294967296, 4294967296] is too large"), std::string::npos)
      << e;
  std::string payload("\x00\x03", 2);  // f32, rank 3: [0, 2^32, 2^32]
  for (uint64_t dim : {uint64_t{0}, uint64_t{1} << 32, uint64_t{1} << 32}) {
    for (int i = 0; i < 8; ++i) payload.push_back(static_cast<char>((dim >> (8 * i)) & 0xff));
  }
  e = error_of([&] { nn::decode_tensor(payload, "z.ckpt"); });
  EXPECT_NE(e.find("z.ckpt: tensor dim 4294967296 is implausible"), std::string::npos) << e;
  // Zero-sized tensors of sane shapes still load.
  EXPECT_EQ(nn::decode_tensor(nn::encode_tensor(Tensor::empty({0, 3}, DType::f32)), "ok").shape(),
            (Shape{0, 3}));
}

TEST(DigitsErrors, CellsAreEscaped) {
  std::string e = error_of([] { nn::parse_digits_csv("1,2,\x1b[31mzz\xff\n", "d.csv"); });
  EXPECT_NE(e.find("d.csv line 1: '\\x1b[31mzz\\xff' is not a number"), std::string::npos) << e;
  EXPECT_TRUE(all_printable(e)) << e;
  std::string row;
  for (int i = 0; i < 64; ++i) row += "16,";
  auto d = nn::parse_digits_csv(row + "7\n" + row + "3\r\n", "d.csv");
  EXPECT_EQ(d.size(), 2);
  EXPECT_EQ(d.labels[1], 3);
  EXPECT_EQ(d.x[0], 1.0f);
  e = error_of([&] { nn::parse_digits_csv(row + row + "1\n", "d.csv"); });
  EXPECT_NE(e.find("more than 65 columns"), std::string::npos) << e;
}

TEST(CheckpointFile, SectionNamesAreEscapedInErrors) {
  std::string bytes = nn::encode_checkpoint({{std::string("w\x1b[2J\xff", 6), "payload"}});
  bytes[bytes.size() - 5] ^= 1;  // a payload byte; then make the file checksum match again
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
  for (int i = 0; i < 4; ++i)
    bytes[bytes.size() - 4 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  std::string e = error_of([&] { nn::decode_checkpoint(bytes, "c.ckpt"); });
  EXPECT_NE(e.find("c.ckpt: section 'w\\x1b[2J\\xff' checksum mismatch"), std::string::npos) << e;
  EXPECT_TRUE(all_printable(e)) << e;
}

TEST(CheckpointFile, StaleTemporaryIsReplaced) {
  const std::string path = io_test::temp_path("stale.ckpt");
  const std::string tmp = path + ".tmp";
  // A write killed midway: garbage longer than the new file, and read-only.
  io_test::write_bytes(tmp, std::string(100000, '\xee'));
  ::chmod(tmp.c_str(), 0444);
  Tensor t = Tensor::from_doubles({2, 2}, {1, 2, 3, 4});
  nn::write_checkpoint(path, {{"w", nn::encode_tensor(t)}, {"meta", "epoch 3\n"}});
  EXPECT_FALSE(io_test::file_exists(tmp)) << "the stale temporary remains";
  auto sections = nn::read_checkpoint(path);
  ASSERT_EQ(sections.size(), 2u);
  Tensor back = nn::decode_tensor(sections[0].payload, path);
  EXPECT_EQ(back.data<float>()[3], 4.0f);
  EXPECT_EQ(sections[1].payload, "epoch 3\n");

  // A symlink planted at the temporary name is replaced, not followed.
  const std::string victim = io_test::temp_path("victim");
  io_test::write_bytes(victim, "keep me");
  ASSERT_EQ(::symlink(victim.c_str(), tmp.c_str()), 0);
  nn::write_checkpoint(path, {{"w", nn::encode_tensor(t)}});
  EXPECT_EQ(io_test::read_bytes(victim), "keep me");
  EXPECT_FALSE(io_test::file_exists(tmp));
  EXPECT_EQ(nn::read_checkpoint(path).size(), 1u);

  // A failed rename (the target is a non-empty directory) leaves no temporary either.
  const std::string dir_target = io_test::temp_path("ckpt_dir");
  ASSERT_EQ(::mkdir(dir_target.c_str(), 0755), 0);
  io_test::write_bytes(dir_target + "/x", "x");
  std::string e = error_of([&] { nn::write_checkpoint(dir_target, {{"w", "x"}}); });
  EXPECT_NE(e.find("cannot rename"), std::string::npos) << e;
  EXPECT_FALSE(io_test::file_exists(dir_target + ".tmp"));
  std::remove((dir_target + "/x").c_str());
  ::rmdir(dir_target.c_str());
  std::remove(path.c_str());
  std::remove(victim.c_str());
}

}  // namespace
}  // namespace qg
