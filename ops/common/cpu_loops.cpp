#include "ops/common/cpu_loops.h"

namespace qg::cpu {

std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> s(out.size(), 0);
  Shape cs = contiguous_strides(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) s[off + i] = in[i] == 1 ? 0 : cs[i];
  return s;
}

}  // namespace qg::cpu
