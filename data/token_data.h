// A tokenized text corpus, prepared once in a data folder and reused:
//   DIR/tokenizer.model     the SentencePiece BPE model, trained on the training split when
//                           absent (an existing one is used as it is)
//   DIR/train.tokens        the training split as one stream of token ids (documents in
//   DIR/validation.tokens   sorted order, each followed by the tokenizer's end-of-sentence id)
// A token file is "QGTOKENS" | u64 key | u64 count | count x i32 ids, little-endian. The key
// hashes the tokenizer model's bytes and the split's file names (relative to the corpus
// folder) and sizes, so a second run reads the ids instead of encoding again, also from a copy
// of the corpus elsewhere, and a changed model or corpus encodes afresh. SentencePiece is
// loaded only to train or encode: with every split cached, the vocabulary size is read from
// the model file itself (count_model_pieces).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace qg::nn {

struct TokenData {
  std::string tokenizer_path;
  int64_t vocab_size = 0;  // the tokenizer's
  int64_t train_files = 0, validation_files = 0;
  std::vector<int32_t> train, validation;
  bool trained_tokenizer = false, encoded = false;  // what this call had to do
};

// `log` receives one line per slow step (training the tokenizer, encoding); may be empty.
// `vocab_size` is the size of a tokenizer trained here. Throws qg::Error (ops
// "data.corpus", "data.tokenizer", "data.tokens") for a bad corpus, an unreadable or
// corrupt tokenizer model, or a data folder that cannot be written.
TokenData prepare_token_data(const std::string& corpus_dir, const std::string& data_dir,
                             int64_t vocab_size,
                             const std::function<void(const std::string&)>& log = {});

// The token-file format on its own (tests, tools). read_token_file returns false when the
// file is absent or its key differs; throws naming the file when it is truncated or not a
// token file.
void write_token_file(const std::string& path, uint64_t key, const std::vector<int32_t>& ids);
bool read_token_file(const std::string& path, uint64_t key, std::vector<int32_t>* ids);

}  // namespace qg::nn
