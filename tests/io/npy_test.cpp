// .npy reading and writing: round-trips for every dtype, NumPy's exact byte layout, and a
// clear qg::Error for each kind of bad file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "core/half.h"
#include "core/npy.h"

namespace qg {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "qg_npy_test_" + std::to_string(::getpid()) + "_" + name + ".npy";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A version-1.0 file with the given header dict (padded as NumPy does) and raw data.
std::string npy_v1(const std::string& dict, const std::string& data) {
  std::string h = dict;
  size_t total = 10 + h.size() + 1;
  h.append((total + 63) / 64 * 64 - total, ' ');
  h.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  return out + h + data;
}

// Expects load_npy(path) to throw a qg::Error with op "npy" whose message names the file
// and contains `needle`.
void expect_load_error(const std::string& path, const std::string& needle) {
  try {
    load_npy(path);
    FAIL() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "npy");
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
  }
  std::remove(path.c_str());
}

void expect_bad_file(const std::string& name, const std::string& bytes, const std::string& needle) {
  std::string path = temp_path(name);
  write_bytes(path, bytes);
  expect_load_error(path, needle);
}

void expect_round_trip(const Tensor& t, const std::string& name) {
  std::string path = temp_path(name);
  save_npy(path, t);
  Tensor back = load_npy(path);
  std::remove(path.c_str());
  EXPECT_EQ(back.dtype(), t.dtype()) << name;
  EXPECT_EQ(back.shape(), t.shape()) << name;
  ASSERT_EQ(back.nbytes(), t.nbytes()) << name;
  if (t.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()), 0) << name;
  }
}

TEST(Npy, RoundTripEveryDtypeAndShape) {
  const std::vector<Shape> shapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 0, 3}, {1, 3, 1, 5}};
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::i8, DType::u8, DType::i32, DType::i64,
                   DType::boolean}) {
    for (const Shape& s : shapes) {
      std::vector<double> v(shape_numel(s));
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = dt == DType::boolean ? (i % 3 == 0) : static_cast<double>(i * 7 % 23) - 11.0;
      }
      expect_round_trip(Tensor::from_doubles(s, v, dt),
                        std::string(dtype_name(dt)) + "_" + std::to_string(s.size()));
    }
  }
}

TEST(Npy, RoundTripKeepsSpecialFloatBits) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> v = {0.0, -0.0, inf, -inf, std::nan(""), 1e-45, 3.4e38};
  expect_round_trip(Tensor::from_doubles({7}, v, DType::f32), "special_f32");
  expect_round_trip(Tensor::from_doubles({7}, v, DType::f64), "special_f64");
  expect_round_trip(Tensor::from_doubles({7}, v, DType::f16), "special_f16");
}

TEST(Npy, WritesNumpysLayout) {
  // np.save(p, np.arange(6, dtype='<i4').reshape(2, 3)) produces exactly these bytes.
  std::string path = temp_path("layout");
  save_npy(path, Tensor::from_doubles({2, 3}, {0, 1, 2, 3, 4, 5}, DType::i32));
  std::string data;
  for (int i = 0; i < 6; ++i) data += std::string{static_cast<char>(i), 0, 0, 0};
  EXPECT_EQ(read_bytes(path),
            npy_v1("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", data));
  save_npy(path, Tensor::from_doubles({1}, {7}, DType::u8));
  EXPECT_EQ(read_bytes(path),
            npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", "\x07"));
  std::remove(path.c_str());
}

TEST(Npy, ReadsVersion2AndReorderedKeys) {
  std::string dict = "{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<f4\"}";
  std::string h = dict + "\n";
  std::string bytes("\x93NUMPY\x02\x00", 8);
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  float vals[2] = {1.5f, -2.0f};
  bytes += h + std::string(reinterpret_cast<const char*>(vals), sizeof(vals));
  std::string path = temp_path("v2");
  write_bytes(path, bytes);
  Tensor t = load_npy(path);
  std::remove(path.c_str());
  ASSERT_EQ(t.shape(), Shape({2}));
  EXPECT_EQ(t.at(0), 1.5);
  EXPECT_EQ(t.at(1), -2.0);
}

TEST(Npy, SaveReplacesAtomicallyAndLeavesNoTempFile) {
  std::string path = temp_path("atomic");
  save_npy(path, Tensor::from_doubles({3}, {1, 2, 3}));
  save_npy(path, Tensor::from_doubles({2}, {4, 5}));
  EXPECT_EQ(load_npy(path).to_doubles(), (std::vector<double>{4, 5}));
  std::remove(path.c_str());
  std::string dir = path.substr(0, path.rfind('/'));
  // A failed write (directory missing) throws and names the path.
  EXPECT_THROW(save_npy(dir + "/no_such_dir_qg/x.npy", Tensor::scalar(1.0)), Error);
}

TEST(Npy, RejectsBf16OnSave) {
  EXPECT_THROW(save_npy(temp_path("bf16"), Tensor::from_doubles({2}, {1, 2}, DType::bf16)), Error);
}

TEST(Npy, RejectsUnsupportedDtypes) {
  const std::string f = "', 'fortran_order': False, 'shape': (2,), }";
  expect_bad_file("c8", npy_v1("{'descr': '<c8" + f, std::string(16, '\0')),
                  "unsupported dtype '<c8'");
  expect_bad_file("be", npy_v1("{'descr': '>f4" + f, std::string(8, '\0')), "big-endian");
  expect_bad_file("u3", npy_v1("{'descr': '<U3" + f, std::string(24, '\0')),
                  "unsupported dtype '<U3'");
  expect_bad_file("u2", npy_v1("{'descr': '<u2" + f, std::string(4, '\0')),
                  "unsupported dtype '<u2'");
}

TEST(Npy, RejectsFortranOrder) {
  expect_bad_file(
      "fortran",
      npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::string(24, '\0')),
      "Fortran-order");
}

TEST(Npy, RejectsTruncatedData) {
  expect_bad_file(
      "trunc",
      npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", std::string(20, '\0')),
      "truncated data");
  std::string full = npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "");
  expect_bad_file("trunc_header", full.substr(0, 40), "truncated header");
  expect_bad_file("trunc_preamble", std::string("\x93NUM", 4), "too short");
}

TEST(Npy, RejectsSurplusData) {
  expect_bad_file(
      "surplus",
      npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", std::string(12, '\0')),
      "shape/data size mismatch");
}

TEST(Npy, RejectsBadMagicAndVersion) {
  std::string good =
      npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'));
  std::string bad = good;
  bad[1] = 'X';
  expect_bad_file("magic", bad, "bad magic");
  bad = good;
  bad[6] = 9;
  expect_bad_file("version", bad, "unsupported format version 9.0");
}

TEST(Npy, RejectsMalformedHeaders) {
  const std::string d4(4, '\0');
  expect_bad_file("nobrace", npy_v1("'descr': '<f4'", d4), "malformed header");
  expect_bad_file("missing", npy_v1("{'descr': '<f4', 'shape': (1,), }", d4),
                  "missing key 'fortran_order'");
  expect_bad_file("extra",
                  npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", d4),
                  "unexpected key 'x'");
  expect_bad_file("negdim", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", d4),
                  "expected a dimension");
  expect_bad_file("notuple", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", d4),
                  "not a tuple");
  expect_bad_file("badbool", npy_v1("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", d4),
                  "expected True or False");
  expect_bad_file("trailing",
                  npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", d4),
                  "trailing characters");
  expect_bad_file(
      "dup", npy_v1("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", d4),
      "duplicate key 'descr'");
}

TEST(Npy, MissingFileNamesThePath) {
  expect_load_error(temp_path("absent"), "cannot open");
}

}  // namespace
}  // namespace qg
