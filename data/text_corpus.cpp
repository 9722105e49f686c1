#include "data/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/file_io.h"

namespace qg::nn {
namespace {

namespace fs = std::filesystem;

constexpr size_t kValidationEvery = 20;

bool is_rst_txt(const fs::path& p) {
  const std::string name = p.filename().string();
  const std::string suffix = ".rst.txt";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uintmax_t total_bytes(const std::vector<std::string>& files) {
  uintmax_t n = 0;
  for (const std::string& f : files) {
    std::error_code ec;
    const uintmax_t s = fs::file_size(f, ec);
    n += ec ? 0 : s;
  }
  return n;
}

}  // namespace

std::string default_text_corpus_dir() {
  return "/usr/share/doc/python3.11/html/_sources";
}

CorpusSplit split_text_corpus(const std::string& dir) {
  std::error_code ec;
  QG_CHECK(fs::is_directory(dir, ec), "data.corpus", "'", dir,
           "' is not a directory (the default corpus comes with Debian's python3.11-doc)");
  std::vector<std::string> relative;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && is_rst_txt(it->path()))
      relative.push_back(fs::relative(it->path(), dir).generic_string());
  QG_CHECK(!ec, "data.corpus", "cannot list '", dir, "': ", ec.message());
  QG_CHECK(!relative.empty(), "data.corpus", "'", dir, "' holds no .rst.txt file");
  std::sort(relative.begin(), relative.end());
  CorpusSplit split;
  const fs::path root = fs::absolute(dir);
  for (size_t i = 0; i < relative.size(); ++i)
    (i % kValidationEvery == 0 ? split.validation : split.train)
        .push_back((root / relative[i]).lexically_normal().string());
  QG_CHECK(!split.train.empty(), "data.corpus", "'", dir, "' holds ", relative.size(),
           " .rst.txt file(s); the split needs at least 2 (every ", kValidationEvery,
           "th, from the first, is held out for validation)");
  QG_CHECK(total_bytes(split.train) > 0, "data.corpus", "the ", split.train.size(),
           " training file(s) under '", dir, "' are empty");
  QG_CHECK(total_bytes(split.validation) > 0, "data.corpus", "the ", split.validation.size(),
           " validation file(s) under '", dir, "' are empty");
  return split;
}

std::string read_text_file(const std::string& path) {
  return read_file_bytes(path, "data.corpus");
}

}  // namespace qg::nn
