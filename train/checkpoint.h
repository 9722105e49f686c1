// Checkpoint files: named sections with lengths and CRC32s, written atomically.
//
// Layout (all integers little-endian):
//   header   magic "QGCKPT\r\n" (8 bytes) | u32 version (1) | u32 section count
//   section  u32 name length | name bytes | u64 payload length | u32 CRC32(payload) | payload
//   trailer  u32 CRC32 of every byte before it
// A tensor payload is: u8 dtype | u8 rank | rank x i64 dims | raw little-endian elements.
// Reading checks the magic, version, every length against the bytes left, every CRC and
// the trailer, so a truncated or corrupted file is a qg::Error, never a crash. Writing goes
// to "<path>.tmp", is fsync'ed, then renamed over `path` (and the directory fsync'ed), so a
// crash mid-write leaves the previous checkpoint intact.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace qg::nn {

struct CheckpointSection {
  std::string name;
  std::string payload;
};

std::string encode_checkpoint(const std::vector<CheckpointSection>& sections);
// `what` names the source (a path) in error messages.
std::vector<CheckpointSection> decode_checkpoint(const std::string& bytes, const std::string& what);

void write_checkpoint(const std::string& path, const std::vector<CheckpointSection>& sections);
std::vector<CheckpointSection> read_checkpoint(const std::string& path);

std::string encode_tensor(const Tensor& t);  // a CPU copy is taken for device tensors
Tensor decode_tensor(const std::string& payload, const std::string& what);

// A decoded checkpoint's sections by name, for the trainers' loaders: a name given twice is an
// error at construction, a missing one when asked for; `what` (a path) names the file.
class CheckpointSections {
 public:
  CheckpointSections(const std::vector<CheckpointSection>& sections, std::string what);
  const std::string& operator()(const std::string& name) const;
  // The "key value" lines of the "meta" section.
  std::map<std::string, std::string> meta() const;
  const std::string& what() const { return what_; }

 private:
  std::map<std::string, const std::string*> by_name_;
  std::string what_;
};

// Atomic file write (temp file, fsync, rename), shared with the metrics writers.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace qg::nn
