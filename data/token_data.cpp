#include "data/token_data.h"

#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "core/error.h"
#include "core/file_io.h"
#include "data/text_corpus.h"
#include "data/tokenizer.h"

namespace qg::nn {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'Q', 'G', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr size_t kHeader = sizeof kMagic + 2 * sizeof(uint64_t);

// FNV-1a, 64 bits: a fingerprint for staleness checks, not security.
uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

// Names relative to the corpus folder, so a corpus copied elsewhere keeps its cache.
uint64_t split_key(uint64_t model_hash, const std::string& corpus_dir,
                   const std::vector<std::string>& files) {
  uint64_t h = model_hash;
  for (const std::string& f : files) {
    const std::string name = fs::path(f).lexically_relative(corpus_dir).generic_string();
    std::error_code ec;
    const uint64_t size = fs::file_size(f, ec);
    h = fnv1a(h, name.data(), name.size());
    h = fnv1a(h, &size, sizeof size);
  }
  return h;
}

std::vector<int32_t> encode_files(const Tokenizer& tok, const std::vector<std::string>& files) {
  std::vector<int32_t> ids;
  for (const std::string& f : files) {
    std::vector<int32_t> doc = tok.encode(read_text_file(f));
    ids.insert(ids.end(), doc.begin(), doc.end());
    ids.push_back(tok.eos_id());
  }
  return ids;
}

}  // namespace

void write_token_file(const std::string& path, uint64_t key, const std::vector<int32_t>& ids) {
  const uint64_t count = ids.size();
  write_file_replacing(path, "data.tokens",
                       {{kMagic, sizeof kMagic},
                        {&key, sizeof key},
                        {&count, sizeof count},
                        {ids.data(), ids.size() * sizeof(int32_t)}});
}

bool read_token_file(const std::string& path, uint64_t key, std::vector<int32_t>* ids) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  const std::string bytes = read_file_bytes(path, "data.tokens");
  QG_CHECK(bytes.size() >= kHeader && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0,
           "data.tokens", "'", path, "' (", bytes.size(), " bytes) is not a token file");
  uint64_t stored_key = 0, count = 0;
  std::memcpy(&stored_key, bytes.data() + sizeof kMagic, sizeof stored_key);
  std::memcpy(&count, bytes.data() + sizeof kMagic + sizeof stored_key, sizeof count);
  if (stored_key != key) return false;
  QG_CHECK(count <= (bytes.size() - kHeader) / sizeof(int32_t) &&
               bytes.size() == kHeader + count * sizeof(int32_t),
           "data.tokens", "'", path, "' is truncated or padded: it declares ", count, " ids in ",
           bytes.size() - kHeader, " bytes");
  ids->resize(count);
  std::memcpy(ids->data(), bytes.data() + kHeader, count * sizeof(int32_t));
  return true;
}

TokenData prepare_token_data(const std::string& corpus_dir, const std::string& data_dir,
                             int64_t vocab_size,
                             const std::function<void(const std::string&)>& log) {
  auto say = [&log](const std::string& line) {
    if (log) log(line);
  };
  CorpusSplit split = split_text_corpus(corpus_dir);
  std::error_code ec;
  fs::create_directories(data_dir, ec);
  QG_CHECK(fs::is_directory(data_dir, ec), "data.tokens", "cannot create the data folder '",
           data_dir, "'");
  TokenData d;
  d.train_files = static_cast<int64_t>(split.train.size());
  d.validation_files = static_cast<int64_t>(split.validation.size());
  d.tokenizer_path = (fs::path(data_dir) / "tokenizer.model").string();
  if (!fs::exists(d.tokenizer_path, ec)) {
    say("training a " + std::to_string(vocab_size) + "-piece BPE tokenizer on " +
        std::to_string(split.train.size()) + " training files -> " + d.tokenizer_path);
    train_bpe_tokenizer(split.train, vocab_size, d.tokenizer_path);
    d.trained_tokenizer = true;
  }
  // The library is loaded only to encode: cached ids need the model's size alone.
  std::optional<Tokenizer> tok;
  const std::string model = read_file_bytes(d.tokenizer_path, "data.tokenizer");
  const uint64_t model_hash = fnv1a(kFnvBasis, model.data(), model.size());
  struct Side {
    const char* name;
    const std::vector<std::string>& files;
    std::vector<int32_t>& ids;
  };
  for (Side side :
       {Side{"train", split.train, d.train}, Side{"validation", split.validation, d.validation}}) {
    const std::string path = (fs::path(data_dir) / (std::string(side.name) + ".tokens")).string();
    const uint64_t key = split_key(model_hash, corpus_dir, side.files);
    if (read_token_file(path, key, &side.ids)) continue;
    say(std::string("encoding the ") + side.name + " split (" + std::to_string(side.files.size()) +
        " files) -> " + path);
    if (!tok) tok = Tokenizer::load(d.tokenizer_path);
    side.ids = encode_files(*tok, side.files);
    write_token_file(path, key, side.ids);
    d.encoded = true;
  }
  d.vocab_size = tok ? tok->vocab_size() : count_model_pieces(model, d.tokenizer_path);
  return d;
}

}  // namespace qg::nn
