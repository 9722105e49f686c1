// safetensors reading and writing: bit-identical round trips for each dtype, the byte layout
// of the writer, a reference file assembled in Python, and one qg::Error per kind of bad
// file (each from a hand-built byte string).
#include "core/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "io_test_util.h"

namespace qg {
namespace {

using io_test::all_printable;
using io_test::error_of;

// An 8-byte little-endian length, the header text, then the data buffer.
std::string st_bytes(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string parse_error(const std::string& header, const std::string& data = "") {
  return error_of([&] { parse_safetensors(st_bytes(header, data), "bad.safetensors"); });
}

Tensor bits_tensor(const Shape& shape, DType dtype, uint8_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed + 37 * i);
  return t;
}

// Empty tensors may have no storage: memcmp must not see their null pointers (UBSan).
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// The tensors of reference_files.py's expected_tensors().
std::map<std::string, Tensor> expected_tensors() {
  std::map<std::string, Tensor> m;
  m["weight"] = Tensor::from_doubles({2, 3}, {-1, -0.5, 0, 0.5, 1, 1.5}, DType::f32);
  m["half"] = Tensor::from_doubles({4}, {1, -2, 0.5, 65504}, DType::f16);
  m["bf"] = Tensor::from_doubles({3}, {1.0, -2.5, 3.140625}, DType::bf16);
  m["idx"] = Tensor::from_vector<int64_t>({2, 2}, {-1, int64_t{1} << 40, 0, 7});
  m["empty"] = Tensor::empty({0, 5}, DType::f32);
  return m;
}

TEST(Safetensors, RoundTripIsBitIdenticalForEveryDtype) {
  std::map<std::string, Tensor> in;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16, DType::i64,
                          DType::f64, DType::i32, DType::i8,   DType::u8};
  uint8_t seed = 1;
  for (DType d : dtypes) in[std::string("t_") + dtype_name(d)] = bits_tensor({3, 5}, d, seed++);
  in["flag"] = Tensor::from_doubles({3}, {1, 0, 1}, DType::boolean);
  in["scalar"] = bits_tensor({}, DType::f32, 9);
  in["nothing"] = Tensor::empty({2, 0}, DType::i64);
  const std::string path = io_test::temp_path("round.safetensors");
  save_safetensors(path, in, {{"k", "v"}, {"note", "caf\xc3\xa9"}});
  std::map<std::string, std::string> meta;
  auto out = load_safetensors(path, &meta);
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out.count(name)) << name;
    EXPECT_TRUE(same_bits(t, out.at(name))) << name;
  }
  EXPECT_EQ(meta.at("k"), "v");
  EXPECT_EQ(meta.at("note"), "caf\xc3\xa9");
  std::remove(path.c_str());
}

TEST(Safetensors, WriterLayoutIsAlignedAndInNameOrder) {
  const std::string bytes = encode_safetensors(
      {{"b", bits_tensor({3}, DType::f32, 1)}, {"a", bits_tensor({1}, DType::f16, 2)}});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string header = bytes.substr(8, n);
  // The JSON ends with its '}'; only spaces pad it.
  EXPECT_EQ(header[header.find_last_not_of(' ')], '}') << header;
  EXPECT_NE(header.find("\"a\":{\"data_offsets\":[0,2]"), std::string::npos) << header;
  EXPECT_NE(header.find("\"b\":{\"data_offsets\":[2,14]"), std::string::npos) << header;
  EXPECT_EQ(bytes.size(), 8 + n + 14);
}

TEST(Safetensors, SaveLeavesNoTemporaryAndFailsCleanly) {
  const std::string path = io_test::temp_path("atomic.safetensors");
  save_safetensors(path, {{"x", bits_tensor({2}, DType::f32, 3)}});
  const std::string dir = ::testing::TempDir();
  const std::string cmd = "ls " + path + ".tmp* >/dev/null 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0) << "a temporary file remains";
  std::string e = error_of([&] {
    save_safetensors(dir + "no_such_dir_qg/x.safetensors",
                     {{"x", bits_tensor({2}, DType::f32, 3)}});
  });
  EXPECT_NE(e.find("no_such_dir_qg/x.safetensors"), std::string::npos) << e;
  e = error_of([&] {
    save_safetensors(path, {{"__metadata__", bits_tensor({1}, DType::f32, 1)}});
  });
  EXPECT_NE(e.find("__metadata__"), std::string::npos) << e;
  e = error_of([&] { save_safetensors(path, {{"\xff\xfe", bits_tensor({1}, DType::f32, 1)}}); });
  EXPECT_NE(e.find("cannot encode the header"), std::string::npos) << e;
  EXPECT_TRUE(all_printable(e)) << e;
  std::remove(path.c_str());
}

TEST(Safetensors, ReadsAFileAssembledInPythonAndPythonReadsOurs) {
  if (!io_test::reference_python_available())
    GTEST_SKIP() << io_test::kPython << " with numpy and torch is not installed";
  const std::string dir = io_test::temp_path("st_ref");
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  ASSERT_EQ(io_test::run_reference_script("write " + dir), 0);
  std::map<std::string, std::string> meta;
  auto got = load_safetensors(dir + "/ref.safetensors", &meta);
  auto want = expected_tensors();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) EXPECT_TRUE(same_bits(t, got.at(name))) << name;
  EXPECT_EQ(meta.at("format"), "pt");

  const std::string ours = dir + "/ours.safetensors";
  save_safetensors(ours, want, {{"writer", "qatgraph"}});
  EXPECT_EQ(io_test::run_reference_script("check " + ours), 0);
}

TEST(Safetensors, TruncatedAndOversizedHeaderLength) {
  std::string e = error_of([] { parse_safetensors(std::string("\x01\x02", 2), "f.st"); });
  EXPECT_NE(e.find("f.st"), std::string::npos);
  EXPECT_NE(e.find("too short (2 bytes)"), std::string::npos) << e;
  std::string bytes = st_bytes("{}");
  bytes[0] = 100;  // 100-byte header in a 10-byte file
  e = error_of([&] { parse_safetensors(bytes, "f.st"); });
  EXPECT_NE(e.find("header length 100 runs past the end of the file (10 bytes)"), std::string::npos)
      << e;
  bytes[7] = 1;  // 2^56 + 100
  e = error_of([&] { parse_safetensors(bytes, "f.st"); });
  EXPECT_NE(e.find("absurdly large"), std::string::npos) << e;
}

TEST(Safetensors, HeaderThatIsNotAJsonObject) {
  std::string e = parse_error("{\"a\": ");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  e = parse_error("[1, 2]");
  EXPECT_NE(e.find("not a JSON object but array"), std::string::npos) << e;
  e = parse_error("{\"a\": 3}");
  EXPECT_NE(e.find("tensor 'a': entry is not an object: 3"), std::string::npos) << e;
  e = parse_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", std::string(4, '\0'));
  EXPECT_NE(e.find("tensor 'a': missing field 'data_offsets'"), std::string::npos) << e;
  e = parse_error("{\"__metadata__\": {\"k\": 1}}");
  EXPECT_NE(e.find("__metadata__ value of 'k' is not a string: 1"), std::string::npos) << e;
  e = parse_error("{\"__metadata__\": []}");
  EXPECT_NE(e.find("__metadata__ is not an object"), std::string::npos) << e;
}

TEST(Safetensors, UnknownDtype) {
  std::string e = parse_error(
      "{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [2], \"data_offsets\": [0, 2]}}", "ab");
  EXPECT_NE(e.find("tensor 'w': unsupported dtype 'F8_E4M3'"), std::string::npos) << e;
  e = parse_error("{\"w\": {\"dtype\": 4, \"shape\": [2], \"data_offsets\": [0, 2]}}", "ab");
  EXPECT_NE(e.find("tensor 'w': dtype is not a string: 4"), std::string::npos) << e;
}

TEST(Safetensors, BadShapes) {
  std::string e =
      parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 0]}}");
  EXPECT_NE(e.find("tensor 'w': shape entry -2 is negative"), std::string::npos) << e;
  e = parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 0]}}");
  EXPECT_NE(e.find("shape entry 1.5 is not a non-negative integer"), std::string::npos) << e;
  e = parse_error(
      "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, "
      "0]}}");
  EXPECT_NE(e.find("shape [4294967296,4294967296] overflows"), std::string::npos) << e;
  // A zero dimension does not excuse the others (found by fuzzing the checkpoint reader).
  e = parse_error(
      "{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 4294967296, 4294967296], \"data_offsets\": "
      "[0, 0]}}");
  EXPECT_NE(e.find("shape [0,4294967296,4294967296] overflows"), std::string::npos) << e;
  e = parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": 3, \"data_offsets\": [0, 0]}}");
  EXPECT_NE(e.find("shape is not an array: 3"), std::string::npos) << e;
}

TEST(Safetensors, BadOffsets) {
  const std::string data(16, 'x');
  std::string e =
      parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", data);
  EXPECT_NE(e.find("data_offsets [0] is not a [begin, end] pair"), std::string::npos) << e;
  e = parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}}",
                  data);
  EXPECT_NE(e.find("data_offsets entry \"0\" is not a non-negative integer"), std::string::npos)
      << e;
  e = parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", data);
  EXPECT_NE(e.find("data_offsets [8, 4] are not in order"), std::string::npos) << e;
  e = parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [16, 20]}}",
                  data);
  EXPECT_NE(e.find("data_offsets [16, 20] end past the data buffer (16 bytes)"), std::string::npos)
      << e;
  e = parse_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", data);
  EXPECT_NE(e.find("tensor 'w': F32 [2] needs 8 bytes but data_offsets [0, 4] hold 4"),
            std::string::npos)
      << e;
}

TEST(Safetensors, OverlapsAndDuplicates) {
  const std::string data(16, 'x');
  std::string e = parse_error(
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
      " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
      data);
  EXPECT_NE(e.find("tensors 'a' [0, 8) and 'b' [4, 12) overlap"), std::string::npos) << e;
  e = parse_error(
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
      " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
      data);
  EXPECT_NE(e.find("duplicate tensor name 'a'"), std::string::npos) << e;
  // Empty tensors hold no bytes, so sharing an offset is fine.
  auto m = parse_safetensors(
      st_bytes("{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]},"
               " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
               data),
      "ok");
  EXPECT_EQ(m.size(), 2u);
}

TEST(Safetensors, FileBytesAreEscapedInErrors) {
  // A name with control characters (legal JSON escapes) and raw garbage instead of JSON.
  std::string e = parse_error(
      "{\"w\\u0001\\u001b[31m\": {\"dtype\": \"Q\\u0007\", \"shape\": [], \"data_offsets\": [0, "
      "0]}}");
  EXPECT_NE(e.find("tensor 'w\\x01\\x1b[31m'"), std::string::npos) << e;
  EXPECT_NE(e.find("dtype 'Q\\x07'"), std::string::npos) << e;
  EXPECT_TRUE(all_printable(e)) << e;
  e = parse_error(std::string("{\"\x01\xff\x1b", 4) + std::string(1000, 'z'));
  EXPECT_TRUE(all_printable(e)) << e;
  EXPECT_LT(e.size(), 800u) << e;
}

}  // namespace
}  // namespace qg
