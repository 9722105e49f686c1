// The declared name of a node's output i, for messages: a fused node's outputs past the
// declared ones (a multi-tensor node has one per part) are numbered.
#pragma once

#include <string>

#include "core/op_schema.h"

namespace qg {

inline std::string output_name(const OpDef& op, size_t i) {
  return i < op.outputs.size() ? op.outputs[i] : "output " + std::to_string(i);
}

}  // namespace qg
