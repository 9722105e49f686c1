#include "core/file_io.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace qg {

std::string read_file_bytes(const std::string& path, const char* op) {
  std::ifstream in(path, std::ios::binary);
  QG_CHECK(in.good(), op, path, ": cannot open for reading (", std::strerror(errno), ")");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  QG_CHECK(!in.bad(), op, path, ": read failed (", std::strerror(errno), ")");
  return bytes;
}

void write_file_replacing(const std::string& path, const char* op,
                          const std::vector<std::pair<const void*, size_t>>& chunks) {
  static std::atomic<int> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  QG_CHECK(f != nullptr, op, path, ": cannot open '", tmp, "' for writing (", std::strerror(errno),
           ")");
  bool ok = true;
  for (const auto& [data, size] : chunks) {
    if (ok && size > 0) ok = std::fwrite(data, 1, size, f) == size;
  }
  const int saved_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    QG_FAIL(op, path, ": write failed (", std::strerror(saved_errno), ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    QG_FAIL(op, path, ": cannot rename the temporary file into place (", std::strerror(e), ")");
  }
}

}  // namespace qg
