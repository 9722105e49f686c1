#include "train/checkpoint_states.h"

#include "core/error.h"
#include "runtime/compile.h"

namespace qg::nn {

std::vector<std::pair<Tensor*, Tensor>> decode_states(Executor& exec,
                                                      const CheckpointSections& sections) {
  std::vector<std::pair<Tensor*, Tensor>> updates;
  for (const auto& [key, dst] : state_index(exec)) {
    const std::string name = "state/" + key;
    Tensor t = decode_tensor(sections(name), sections.what() + " [" + name + "]");
    QG_CHECK(t.dtype() == dst->dtype() && t.shape() == dst->shape(), "checkpoint", sections.what(),
             ": '", name, "' holds ", dtype_name(t.dtype()), shape_str(t.shape()),
             ", the model needs ", dtype_name(dst->dtype()), shape_str(dst->shape()));
    updates.emplace_back(dst, t);
  }
  return updates;
}

}  // namespace qg::nn
