// Helpers shared by the tensor-file tests: temporary paths, raw byte files, and the
// reference-file script run with Debian's python3.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"

namespace qg::io_test {

inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "qg_io_test_" + std::to_string(::getpid()) + "_" + name;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline bool file_exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

// The message of the qg::Error that `f` throws ("" and a test failure if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const qg::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a qg::Error";
  return "";
}

// True when no byte of `s` is a control character or outside ASCII.
inline bool all_printable(const std::string& s) {
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\n') || c > 0x7e) return false;
  }
  return true;
}

// tests/io/reference_files.py (QG_IO_TEST_DIR is set by tests/CMakeLists.txt).
inline std::string reference_script() {
  return std::string(QG_IO_TEST_DIR) + "/reference_files.py";
}

inline const char* kPython = "/usr/bin/python3";

// The reference files need Debian's python3 with numpy and torch (scripts/install_deps.sh
// installs both); a machine without them (the GPU image keeps its own Python elsewhere)
// skips those tests instead of failing them.
inline bool reference_python_available() {
  if (!file_exists(kPython)) return false;
  const std::string cmd = std::string(kPython) + " -c 'import numpy, torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Runs the reference script with `args`; returns its exit status.
inline int run_reference_script(const std::string& args) {
  const std::string cmd = std::string(kPython) + " " + reference_script() + " " + args;
  return std::system(cmd.c_str());
}

}  // namespace qg::io_test
