// A SentencePiece tokenizer (Debian's libsentencepiece): BPE models trained here on a
// corpus's training split, and encoding of text into token ids in C++. The library is an
// optional dependency; a build without it (tokenizer_available() false) throws a qg::Error
// naming the Debian packages from every function below.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace qg::nn {

// Whether this build has SentencePiece.
bool tokenizer_available();

class Tokenizer {
 public:
  // Loads a SentencePiece model file; qg::Error (op "data.tokenizer") naming the file when it
  // cannot be read or is not a SentencePiece model.
  static Tokenizer load(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  int64_t vocab_size() const;
  // The end-of-sentence id, written between documents of a token stream.
  int32_t eos_id() const;
  std::vector<int32_t> encode(const std::string& text) const;
  std::string piece(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The number of pieces of a serialized SentencePiece model, read from its protobuf wire format
// (ModelProto's repeated field 1) without loading the library: enough to size a model for
// token ids that are already cached. qg::Error (op "data.tokenizer") naming `what` when the
// bytes are not a well-formed protobuf message or hold no piece.
int64_t count_model_pieces(const std::string& model_bytes, const std::string& what);

// Trains a BPE model of `vocab_size` pieces on the non-empty lines of `files` and writes it
// to `model_path` atomically. Deterministic for the same files.
void train_bpe_tokenizer(const std::vector<std::string>& files, int64_t vocab_size,
                         const std::string& model_path);

}  // namespace qg::nn
