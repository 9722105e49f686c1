// Whole-file reads and atomic whole-file writes shared by the tensor file formats.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace qg {

/// The bytes of `path`; a qg::Error with op `op` naming the file if it cannot be read.
std::string read_file_bytes(const std::string& path, const char* op);

/// Writes the concatenation of `chunks` (pointer, length) to a uniquely named temporary file
/// next to `path`, then renames it over `path`: a reader sees the old file or the complete
/// new one, and a failure leaves no temporary behind.
void write_file_replacing(const std::string& path, const char* op,
                          const std::vector<std::pair<const void*, size_t>>& chunks);

}  // namespace qg
