// Importing pretrained float weights (a safetensors or .npz file of named tensors) into a
// model's parameters and buffers: every live "parameter" node of an executor's graph, which
// for build_model's models is each layer's weight and bias, each conv-bn's gamma and beta,
// and each batch norm's running_mean and running_var. Observer statistics and qparams are
// never imported: they come from calibration (PTQ) or from QAT itself.
//
// File names become model names through a NameMapper: an optional exact table first, then
// the PyTorch state_dict rules of torch_name_match (see there). Everything is validated
// before anything is written: one qg::Error (op "nn.import") lists every file tensor that
// matches no parameter, every parameter the file lacks, and every shape or dtype mismatch,
// and a failed import leaves the executor's states untouched. A successful one writes into
// the parameters' existing buffers, so a compiled step that has already run sees it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "runtime/executor.h"

namespace qg::nn {

// What one file tensor name becomes.
struct NameMatch {
  // Model parameter names to try, in order; the first one the model has is taken.
  std::vector<std::string> candidates;
  // Non-empty: the tensor is deliberately left out, for this reason (candidates unused).
  std::string ignore_reason;
};
using NameMapper = std::function<NameMatch(const std::string& file_name)>;

// The built-in rules for PyTorch state_dict names (a leading "module." from DataParallel /
// DistributedDataParallel is stripped first):
//   <name>                         -> <name> (fc1.weight, conv1.bn.running_var, and every
//                                     name of a torch.ao QAT ConvBnReLU2d / Linear)
//   <p>.conv.weight                -> <p>.weight    (a Conv2d + BatchNorm2d module pair
//   <p>.bn.<t>                     -> <p>.bn.<t>     held as .conv and .bn)
//   <p>.0.<t>                      -> <p>.<t>       (fuse_modules' ConvBnReLU2d / LinearReLU,
//   <p>.1.<t>                      -> <p>.bn.<t>     sequentials of conv/linear, bn, relu)
//   *.num_batches_tracked          ignored: torch's BatchNorm reads it only when momentum is
//                                  None (a cumulative average); ours always uses momentum 0.1
//   *.activation_post_process.*,   ignored: observer and fake-quant state (scales, zero
//   *.weight_fake_quant.*            points, min/max, enable flags) of a torch QAT model
NameMatch torch_name_match(const std::string& file_name);

// An exact table (file name -> model name; an empty model name ignores the tensor) consulted
// before `fallback`.
NameMapper name_table(std::map<std::string, std::string> table,
                      NameMapper fallback = torch_name_match);

struct ImportReport {
  std::vector<std::pair<std::string, std::string>> loaded;   // file name, model name
  std::vector<std::pair<std::string, std::string>> ignored;  // file name, reason
  std::string summary() const;  // "imported 7 tensors; ignored 3 (...)"
};

// The named tensors of a weight file: ".npz" is read as NumPy .npz, ".safetensors" as
// safetensors; any other name by its content (a ZIP signature means .npz). A file the reader
// rejects is a qg::Error with op "nn.import" that carries the reader's message.
std::map<std::string, Tensor> read_weight_file(const std::string& path);

// Imports `tensors` into every live parameter node of `exec`'s graph. Floating tensors (f32,
// f16, bf16, f64) are converted to the parameter's dtype (f64 rounds to nearest); integer
// and bool tensors load only into a parameter of the same dtype; values must be finite.
// `what` names the source in error messages.
ImportReport import_weights(Executor& exec, const std::map<std::string, Tensor>& tensors,
                            const NameMapper& mapper = torch_name_match,
                            const std::string& what = "weights");
ImportReport import_weights_file(Executor& exec, const std::string& path,
                                 const NameMapper& mapper = torch_name_match);

}  // namespace qg::nn
