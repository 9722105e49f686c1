// `qat crosscheck` cases of rope beyond its gradient-check samples, each with its backward:
// Llama's head dims (64, 128) at positions 0..T-1, grouped-query key shapes, position ids
// shared by the batch ([1, seq]), random and long-context positions (angles of 1e5 rad, where
// the f32 angle and the argument reduction of cos/sin matter) and the smallest head_dim, 2.
// cos and sin come from the host libm on the CPU and CUDA's f64 functions on the GPU, so the
// output is compared to rounding: an f32 cos that differs in its last bit moves y by an ulp.
#include "ops/common/crosscheck_inputs.h"

namespace qg {
namespace {

using namespace crosscheck_spec;

// Positions 0..seq-1 for each of `rows` rows, then `offset` added.
GradcheckInput positions(int64_t rows, int64_t seq, int64_t offset = 0) {
  std::vector<double> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < seq; ++t) v.push_back(static_cast<double>(t + offset + r));
  return fixed({rows, seq}, DType::i64, 0, 0, v);
}

Attrs theta(double t) {
  return {{"rope_theta", t}};
}

std::vector<CrosscheckCase> cases() {
  std::vector<CrosscheckCase> c;
  c.push_back({"q [2,16,64,128]", {x_in({2, 16, 64, 128}), positions(2, 64)}, theta(1e4), true});
  c.push_back({"gqa k [2,8,64,64]", {x_in({2, 8, 64, 64}), positions(2, 64)}, theta(1e4), true});
  c.push_back({"shared positions [3,4,17,64] by [1,17]",
               {x_in({3, 4, 17, 64}), positions(1, 17)},
               theta(1e4),
               true});
  c.push_back({"random positions [3,2,7,32]",
               {x_in({3, 2, 7, 32}), fixed({3, 7}, DType::i64, 0, 4096)},
               theta(1e4),
               true});
  c.push_back({"long context [1,4,16,128] theta 500000",
               {x_in({1, 4, 16, 128}), positions(1, 16, 100000)},
               theta(5e5),
               true});
  c.push_back({"head_dim 2 [2,3,5,2]", {x_in({2, 3, 5, 2}), positions(2, 5)}, theta(1e4), true});
  return c;
}

}  // namespace

void add_rope_crosscheck(OpRegistry& r) {
  set_cases(r, "rope", cases);
  set_rounded_outputs(r, "rope", {-1}, "cos and sin of libm against CUDA's");
}

}  // namespace qg
