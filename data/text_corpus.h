// A text corpus as a folder of reStructuredText sources: by default the Python
// documentation's `_sources/` that Debian's python3.11-doc installs (497 .rst.txt files,
// about 11 MB of English prose). The files are split by file into training and validation
// text, deterministically: in the sorted list of paths relative to the folder, every 20th
// file (indices 0, 20, 40, ...) is held out for validation, so no paragraph is in both.
#pragma once

#include <string>
#include <vector>

namespace qg::nn {

// Where Debian's python3.11-doc puts the documentation sources.
std::string default_text_corpus_dir();

struct CorpusSplit {
  std::vector<std::string> train, validation;  // absolute paths, sorted
};

// Every *.rst.txt under `dir` (recursively), split as above. Throws qg::Error (op
// "data.corpus") when `dir` is not a readable directory, holds no .rst.txt file, or every
// file of one side of the split is empty.
CorpusSplit split_text_corpus(const std::string& dir);

// The text of one file; qg::Error naming it when unreadable.
std::string read_text_file(const std::string& path);

}  // namespace qg::nn
