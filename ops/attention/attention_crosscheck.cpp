// `qat crosscheck` cases of causal_attention beyond its gradient-check samples, each with its
// backward: Llama's shapes (head dims 64 and 128, GQA and MQA), T = 1, T odd and not a
// multiple of the GPU's tiles, a custom scale, a head dim off the GPU's tiled ones, and large
// scores (values to +/-4, so the softmax is far from uniform). Outputs agree to rounding: the GPU
// sums per tile with the online-softmax rescaling, the CPU per row in key order.
#include "ops/common/crosscheck_inputs.h"

namespace qg {
namespace {

using namespace crosscheck_spec;

std::vector<CrosscheckCase> cases() {
  std::vector<CrosscheckCase> c;
  auto add = [&](const std::string& label, int64_t n, int64_t h, int64_t kv, int64_t t, int64_t hd,
                 double range, Attrs attrs = {}) {
    c.push_back({label,
                 {x_in({n, h, t, hd}, -range, range), x_in({n, kv, t, hd}, -range, range),
                  x_in({n, kv, t, hd}, -range, range)},
                 std::move(attrs),
                 true});
  };
  add("llama GQA [2,4,65,64] kv 2", 2, 4, 2, 65, 64, 1);
  add("MQA [1,4,70,128] kv 1", 1, 4, 1, 70, 128, 1);
  add("T=1 [3,2,1,64] kv 2", 3, 2, 2, 1, 64, 1);
  add("odd T [1,2,33,128] kv 2", 1, 2, 2, 33, 128, 1);
  add("scale 0.05 [1,2,40,64] kv 1", 1, 2, 1, 40, 64, 1, {{"scale", 0.05}});
  add("large scores [1,2,37,64] kv 1", 1, 2, 1, 37, 64, 4);
  add("small head dim [1,4,19,32] kv 2", 1, 4, 2, 19, 32, 1);  // the per-row CUDA kernels
  return c;
}

}  // namespace

void add_attention_crosscheck(OpRegistry& r) {
  set_cases(r, "causal_attention", cases);
  for (const char* op : {"causal_attention", "causal_attention_backward"})
    set_rounded_outputs(r, op, {-1}, "the GPU sums per tile with online-softmax rescaling");
}

}  // namespace qg
