// Running the real `qat` binary from a GoogleTest (the CLI tests of tests/io and
// tests/export_onnx): where it is, and one command's exit status and output.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace qg::testing {

// The qat binary: $QG_QAT when set (ctest sets it), else the build tree's apps/qat beside
// this test's folder (CMake puts tests/test_* and apps/qat side by side in the build
// directory); "" when neither exists.
inline std::string find_qat() {
  if (const char* env = std::getenv("QG_QAT")) return env;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string exe(self, static_cast<size_t>(n));
  std::string dir = exe.substr(0, exe.rfind('/'));
  std::string candidate = dir.substr(0, dir.rfind('/')) + "/apps/qat";
  return ::access(candidate.c_str(), X_OK) == 0 ? candidate : "";
}

struct CmdResult {
  int status = -1;     // the exit status; -1 when the process did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs `'qat' <args>` through the shell (args are shell words, quoted by the caller).
inline CmdResult run_qat(const std::string& qat, const std::string& args) {
  CmdResult r;
  std::string cmd = "'" + qat + "' " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::array<char, 512> buf;
  while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) r.output += buf.data();
  int raw = pclose(pipe.release());
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

}  // namespace qg::testing
