#include "nn/hf_checkpoint.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/printable.h"
#include "core/safetensors.h"

namespace qg::nn {

const char* const kHfSingleFile = "model.safetensors";
const char* const kHfIndexFile = "model.safetensors.index.json";

namespace {

constexpr const char* kOp = "nn.import";
using Json = nlohmann::json;

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// One weight file of the folder; a file the safetensors reader rejects (truncated, a bad
// header) is an error naming the file and carrying the reader's message.
std::map<std::string, Tensor> read_weights(const std::string& path) {
  const std::string bytes = read_file_bytes(path, kOp);
  try {
    return parse_safetensors(bytes, path);
  } catch (const Error& e) {
    QG_FAIL(kOp, "cannot read weights from '", printable(path), "': [", e.op(), "] ", e.message());
  }
}

// The weight map of an index file: tensor name -> shard file name. A shard name must be a
// plain file name of the folder: save_pretrained writes nothing else, and a path could
// reach outside the checkpoint.
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  const std::string text = read_file_bytes(path, kOp);
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  QG_CHECK(!j.is_discarded(), kOp, "'", printable(path), "' is not valid JSON");
  QG_CHECK(j.is_object(), kOp, "'", printable(path), "' is not a JSON object but ", j.type_name());
  auto it = j.find("weight_map");
  QG_CHECK(it != j.end(), kOp, "'", printable(path), "' has no \"weight_map\"");
  QG_CHECK(it->is_object(), kOp, "'", printable(path), "': \"weight_map\" is not an object but ",
           it->type_name());
  QG_CHECK(!it->empty(), kOp, "'", printable(path), "': \"weight_map\" is empty");
  std::map<std::string, std::string> map;
  for (const auto& [name, shard] : it->items()) {
    QG_CHECK(shard.is_string(), kOp, "'", printable(path), "': \"weight_map\" entry '",
             printable(name), "' is not a file name but ", printable(shard.dump()));
    const auto& s = shard.get_ref<const std::string&>();
    QG_CHECK(!s.empty() && s.find('/') == std::string::npos && s != "." && s != "..", kOp, "'",
             printable(path), "': \"weight_map\" entry '", printable(name), "' names '",
             printable(s), "', which is not a file name in the checkpoint folder");
    map.emplace(name, s);
  }
  return map;
}

HfCheckpoint read_sharded(const std::string& dir, const std::string& index_path) {
  const std::map<std::string, std::string> weight_map = read_weight_map(index_path);
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> its listed names
  for (const auto& [name, shard] : weight_map) by_shard[shard].push_back(name);

  HfCheckpoint ck;
  std::vector<std::string> absent, unlisted, not_in_shard;
  for (const auto& [shard, names] : by_shard) {
    const std::string path = join_path(dir, shard);
    if (!is_file(path)) {
      absent.push_back("'" + printable(shard) + "' (" + std::to_string(names.size()) +
                       " tensor(s), e.g. '" + printable(names.front()) + "')");
      continue;
    }
    std::map<std::string, Tensor> tensors = read_weights(path);
    ck.files.push_back(shard);
    for (auto& [name, t] : tensors) {
      auto it = weight_map.find(name);
      if (it == weight_map.end()) {
        unlisted.push_back("'" + printable(name) + "' in '" + printable(shard) +
                           "' is not in the weight map");
      } else if (it->second != shard) {
        unlisted.push_back("'" + printable(name) + "' in '" + printable(shard) +
                           "' is mapped to '" + printable(it->second) + "'");
      } else {
        ck.source[name] = shard;
        ck.tensors.emplace(name, std::move(t));
      }
    }
    for (const std::string& name : names)
      if (!ck.source.count(name))
        not_in_shard.push_back("'" + printable(name) + "' is not in '" + printable(shard) + "'");
  }
  if (absent.empty() && unlisted.empty() && not_in_shard.empty()) return ck;
  std::ostringstream os;
  os << "the sharded checkpoint '" << printable(index_path) << "' (" << weight_map.size()
     << " tensors in " << by_shard.size() << " shard(s)) does not match its shards:";
  auto section = [&](const std::vector<std::string>& items, const std::string& title) {
    if (items.empty()) return;
    os << "\n  " << items.size() << ' ' << title << ":";
    for (const std::string& s : items) os << "\n    " << s;
  };
  section(absent, "shard file(s) missing");
  section(not_in_shard, "weight-map name(s) missing from their shard");
  section(unlisted, "shard tensor(s) the weight map does not place there");
  QG_FAIL(kOp, os.str());
}

}  // namespace

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

HfCheckpoint read_hf_checkpoint(const std::string& dir) {
  QG_CHECK(is_dir(dir), kOp, "the checkpoint folder '", printable(dir), "' does not exist");
  const std::string single = join_path(dir, kHfSingleFile);
  const std::string index = join_path(dir, kHfIndexFile);
  if (is_file(single)) {
    HfCheckpoint ck;
    ck.tensors = read_weights(single);
    for (const auto& [name, t] : ck.tensors) ck.source[name] = kHfSingleFile;
    ck.files.push_back(kHfSingleFile);
    return ck;
  }
  if (is_file(index)) return read_sharded(dir, index);
  const bool pickle = is_file(join_path(dir, "pytorch_model.bin")) ||
                      is_file(join_path(dir, "pytorch_model.bin.index.json"));
  QG_FAIL(kOp, "the checkpoint folder '", printable(dir), "' has neither ", kHfSingleFile, " nor ",
          kHfIndexFile,
          pickle ? " (it holds pytorch_model.bin: PyTorch pickles are not read; save the model "
                   "with save_pretrained's default safetensors serialization)"
                 : "");
}

}  // namespace qg::nn
