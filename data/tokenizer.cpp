#include "data/tokenizer.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/file_io.h"
#include "data/sentencepiece/sentencepiece_module.h"

namespace qg::nn {
namespace {

// The functions of the qg_sentencepiece module (data/sentencepiece/sentencepiece_module.h
// says why it is a module loaded on its own), resolved once per process.
struct Module {
  decltype(&qg_spm_load) load = nullptr;
  decltype(&qg_spm_free) free = nullptr;
  decltype(&qg_spm_piece_size) piece_size = nullptr;
  decltype(&qg_spm_eos_id) eos_id = nullptr;
  decltype(&qg_spm_piece) piece = nullptr;
  decltype(&qg_spm_encode) encode = nullptr;
  decltype(&qg_spm_train) train = nullptr;
  decltype(&qg_spm_free_buffer) free_buffer = nullptr;
  std::string error;  // why it could not be loaded; empty when loaded
};

#ifdef QG_SENTENCEPIECE_MODULE
#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer's runtime refuses RTLD_DEEPBIND. Without it the module still works in a
// program that does not load libprotobuf (every test binary but the ONNX exporter's).
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

// $QG_SENTENCEPIECE_MODULE, then the module of the build tree, then the installed one.
std::vector<std::string> module_candidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("QG_SENTENCEPIECE_MODULE")) paths.push_back(env);
  paths.push_back(QG_SENTENCEPIECE_MODULE);
  paths.push_back(QG_SENTENCEPIECE_MODULE_INSTALLED);
  return paths;
}

Module open_module() {
  Module m;
  std::string tried;
  void* handle = nullptr;
  for (const std::string& path : module_candidates()) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      tried += " '" + path + "' (absent)";
      continue;
    }
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
    if (handle != nullptr) break;
    const char* why = ::dlerror();
    tried += " '" + path + "' (" + (why ? why : "dlopen failed") + ")";
  }
  if (handle == nullptr) {
    m.error = "cannot load the SentencePiece module; tried" + tried;
    return m;
  }
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(handle, name));
    if (fn == nullptr && m.error.empty()) m.error = std::string("the module lacks ") + name;
  };
  get(m.load, "qg_spm_load");
  get(m.free, "qg_spm_free");
  get(m.piece_size, "qg_spm_piece_size");
  get(m.eos_id, "qg_spm_eos_id");
  get(m.piece, "qg_spm_piece");
  get(m.encode, "qg_spm_encode");
  get(m.train, "qg_spm_train");
  get(m.free_buffer, "qg_spm_free_buffer");
  return m;
}
#endif

const Module& module() {
#ifdef QG_SENTENCEPIECE_MODULE
  static const Module m = open_module();
  QG_CHECK(m.error.empty(), "data.tokenizer", m.error);
  return m;
#else
  QG_FAIL("data.tokenizer",
          "this build has no SentencePiece: install Debian's libsentencepiece-dev and "
          "sentencepiece (scripts/install_deps.sh) and configure again");
#endif
}

}  // namespace

struct Tokenizer::Impl {
  const Module* m = nullptr;
  void* processor = nullptr;
  ~Impl() {
    if (processor != nullptr) m->free(processor);
  }
};

bool tokenizer_available() {
#ifdef QG_SENTENCEPIECE_MODULE
  return true;
#else
  return false;
#endif
}

Tokenizer Tokenizer::load(const std::string& path) {
  const Module& m = module();
  // Read the bytes here, so that an unreadable file is named as such, and a corrupt one as a
  // model SentencePiece cannot parse.
  const std::string bytes = read_file_bytes(path, "data.tokenizer");
  char err[512] = {};
  auto impl = std::make_unique<Impl>();
  impl->m = &m;
  impl->processor = m.load(bytes.data(), bytes.size(), err, sizeof err);
  QG_CHECK(impl->processor != nullptr, "data.tokenizer", "'", path, "' (", bytes.size(),
           " bytes) is not a SentencePiece model: ", err);
  QG_CHECK(m.piece_size(impl->processor) > 0, "data.tokenizer", "'", path, "' has no pieces");
  return Tokenizer(std::move(impl));
}

int64_t Tokenizer::vocab_size() const {
  return impl_->m->piece_size(impl_->processor);
}

int32_t Tokenizer::eos_id() const {
  return impl_->m->eos_id(impl_->processor);
}

std::string Tokenizer::piece(int32_t id) const {
  char buf[256] = {};
  const size_t n = impl_->m->piece(impl_->processor, id, buf, sizeof buf);
  return std::string(buf, std::min(n, sizeof buf - 1));
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  int32_t* ids = nullptr;
  char err[512] = {};
  const int64_t n =
      impl_->m->encode(impl_->processor, text.data(), text.size(), &ids, err, sizeof err);
  QG_CHECK(n >= 0, "data.tokenizer", "encoding ", text.size(), " bytes failed: ", err);
  std::vector<int32_t> out(ids, ids + n);
  impl_->m->free_buffer(ids);
  return out;
}

void train_bpe_tokenizer(const std::vector<std::string>& files, int64_t vocab_size,
                         const std::string& model_path) {
  const Module& m = module();
  QG_CHECK(!files.empty(), "data.tokenizer", "no training files for the tokenizer");
  QG_CHECK(vocab_size >= 8, "data.tokenizer", "vocab_size ", vocab_size, " must be >= 8");
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const std::vector<std::pair<std::string, std::string>> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      // SentencePiece's default: the rarest 0.05% of characters (the Unicode HOWTO's samples)
      // become <unk> rather than taking pieces from a small vocabulary.
      {"character_coverage", "0.9995"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "2"},  // warnings and errors only
  };
  std::vector<const char*> names, keys, values;
  for (const std::string& f : files) names.push_back(f.c_str());
  for (const auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  char* model = nullptr;
  size_t size = 0;
  char err[512] = {};
  const int rc = m.train(names.data(), names.size(), keys.data(), values.data(), keys.size(),
                         &model, &size, err, sizeof err);
  QG_CHECK(rc == 0, "data.tokenizer", "training a BPE model of ", vocab_size, " pieces on ",
           files.size(), " files failed: ", err);
  std::string bytes(model, size);
  m.free_buffer(model);
  write_file_replacing(model_path, "data.tokenizer", {{bytes.data(), bytes.size()}});
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

// A base-128 varint at bytes[*at]; false when it runs past the end or over 10 bytes.
bool read_varint(const std::string& bytes, size_t* at, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && *at < bytes.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(bytes[(*at)++]);
    *value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

int64_t count_model_pieces(const std::string& model_bytes, const std::string& what) {
  // Top-level fields only: wire types 0 (varint), 1 (8 bytes), 2 (length-delimited) and
  // 5 (4 bytes) are skipped over; a piece is field 1, length-delimited.
  int64_t pieces = 0;
  size_t at = 0;
  while (at < model_bytes.size()) {
    uint64_t key = 0, n = 0;
    const size_t field_at = at;
    bool ok = read_varint(model_bytes, &at, &key);
    const uint64_t wire = key & 7;
    if (ok && wire == 0) ok = read_varint(model_bytes, &at, &n);
    if (ok && (wire == 1 || wire == 5)) n = wire == 1 ? 8 : 4;
    if (ok && wire == 2) ok = read_varint(model_bytes, &at, &n);
    ok = ok && (key >> 3) != 0 && (wire == 0 || wire == 1 || wire == 2 || wire == 5);
    if (ok && wire != 0) ok = n <= model_bytes.size() - at;
    QG_CHECK(ok, "data.tokenizer", what, " is not a SentencePiece model: malformed field at byte ",
             field_at, " of ", model_bytes.size());
    if (wire != 0) at += static_cast<size_t>(n);
    if ((key >> 3) == 1 && wire == 2) ++pieces;
  }
  QG_CHECK(pieces > 0, "data.tokenizer", what, " is not a SentencePiece model: it holds no piece");
  return pieces;
}

}  // namespace qg::nn
