#include "data/sentencepiece/sentencepiece_module.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

void set_error(char* err, size_t size, const std::string& what) {
  if (err == nullptr || size == 0) return;
  const size_t n = what.size() < size - 1 ? what.size() : size - 1;
  std::memcpy(err, what.data(), n);
  err[n] = '\0';
}

// The lines of the training files, one sentence each, as SentencePiece's trainer reads them.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const char* const* files, size_t count) : files_(files, files + count) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (true) {
      if (stream_.is_open() && std::getline(stream_, line_)) {
        if (line_.find_first_not_of(" \t\r") != std::string::npos) return;
        continue;
      }
      if (stream_.is_open()) stream_.close();
      if (next_ == files_.size()) {
        done_ = true;
        return;
      }
      stream_.open(files_[next_++], std::ios::binary);
      if (!stream_.is_open()) {
        status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound,
                                              std::string("cannot read ") + files_[next_ - 1]);
        done_ = true;
        return;
      }
    }
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }

 private:
  std::vector<const char*> files_;
  size_t next_ = 0;
  std::ifstream stream_;
  std::string line_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

const sentencepiece::SentencePieceProcessor& sp(const void* p) {
  return *static_cast<const sentencepiece::SentencePieceProcessor*>(p);
}

}  // namespace

extern "C" {

void* qg_spm_load(const char* bytes, size_t size, char* err, size_t err_size) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  const auto status = p->LoadFromSerializedProto(std::string(bytes, size));
  if (!status.ok()) {
    set_error(err, err_size, status.ToString());
    delete p;
    return nullptr;
  }
  return p;
}

void qg_spm_free(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

int32_t qg_spm_piece_size(const void* processor) {
  return sp(processor).GetPieceSize();
}

int32_t qg_spm_eos_id(const void* processor) {
  return sp(processor).eos_id();
}

size_t qg_spm_piece(const void* processor, int32_t id, char* out, size_t out_size) {
  const std::string piece = sp(processor).IdToPiece(id);
  set_error(out, out_size, piece);
  return piece.size();
}

int64_t qg_spm_encode(const void* processor, const char* text, size_t size, int32_t** ids,
                      char* err, size_t err_size) {
  std::vector<int> v;
  const auto status = sp(processor).Encode(std::string(text, size), &v);
  if (!status.ok()) {
    set_error(err, err_size, status.ToString());
    return -1;
  }
  *ids = static_cast<int32_t*>(std::malloc(sizeof(int32_t) * (v.empty() ? 1 : v.size())));
  for (size_t i = 0; i < v.size(); ++i) (*ids)[i] = v[i];
  return static_cast<int64_t>(v.size());
}

int qg_spm_train(const char* const* files, size_t file_count, const char* const* keys,
                 const char* const* values, size_t option_count, char** model, size_t* model_size,
                 char* err, size_t err_size) {
  std::unordered_map<std::string, std::string> args;
  for (size_t i = 0; i < option_count; ++i) args[keys[i]] = values[i];
  LineIterator lines(files, file_count);
  std::string out;
  auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &out);
  if (status.ok()) status = lines.status();
  if (!status.ok()) {
    set_error(err, err_size, status.ToString());
    return -1;
  }
  *model = static_cast<char*>(std::malloc(out.empty() ? 1 : out.size()));
  std::memcpy(*model, out.data(), out.size());
  *model_size = out.size();
  return 0;
}

void qg_spm_free_buffer(void* buffer) {
  std::free(buffer);
}
}
