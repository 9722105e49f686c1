// The weights of a Hugging Face checkpoint folder, as save_pretrained writes them:
//   model.safetensors                    one file holding every tensor, or
//   model.safetensors.index.json         {"metadata": {...}, "weight_map": {name: shard}}
//   model-0000k-of-0000n.safetensors     the shards the weight map names.
// A folder holding both model.safetensors and an index is read from model.safetensors, as
// transformers' from_pretrained does. PyTorch pickles (pytorch_model.bin) are not read.
//
// A sharded checkpoint is read whole and cross-checked before anything is returned: every
// shard the index names must exist and parse, every name in the weight map must be in its
// shard, and every tensor of a shard must be listed for that shard; all such problems come
// in one qg::Error (op "nn.import") that names the index, the shards and the tensors.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace qg::nn {

struct HfCheckpoint {
  std::map<std::string, Tensor> tensors;      // every tensor, by name
  std::map<std::string, std::string> source;  // tensor name -> the file (in the folder) holding it
  std::vector<std::string> files;             // the weight files read, in reading order
};

// The folder's file names: "model.safetensors" and "model.safetensors.index.json".
extern const char* const kHfSingleFile;
extern const char* const kHfIndexFile;

// Reads the weights of the checkpoint folder `dir` (see above).
HfCheckpoint read_hf_checkpoint(const std::string& dir);

// `dir` + "/" + `name` (no separator doubled).
std::string join_path(const std::string& dir, const std::string& name);

}  // namespace qg::nn
