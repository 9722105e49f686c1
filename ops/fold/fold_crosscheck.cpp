// `qat crosscheck` cases of conv_bn_fold_weight: the CNN's [64, 64, 3, 3] weights with the
// gradient of either output, a row longer than the backward kernel's shared-memory chunk, and
// NaN, infinities and signed zeros in every input. Every output, dgamma's f64 sum included,
// is compared bit for bit: the GPU adds in the CPU's order.
#include <cmath>

#include "ops/common/crosscheck_inputs.h"

namespace qg {
namespace {

using namespace crosscheck_spec;

GradcheckInput in(Shape s, double lo, double hi, std::vector<double> v = {}) {
  return GradcheckInput(std::move(s), DType::f64, lo, hi, std::move(v));
}

std::vector<double> with_edges(int64_t n, double lo, double hi) {
  const double edges[] = {kNaN, kInf, -kInf, 0.0, -0.0};
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = lo + (hi - lo) * (0.5 + 0.5 * std::sin(1.3 * static_cast<double>(i)));
  for (int64_t i = 2; i < n; i += 7) v[i] = edges[(i / 7) % 5];
  return v;
}

std::vector<CrosscheckCase> fold_cases() {
  std::vector<CrosscheckCase> c;
  const Shape w{64, 64, 3, 3}, v{64};
  const Attrs eps{{"eps", 1e-5}};
  for (int output : {0, 1})
    c.push_back({output == 0 ? "[64,64,3,3] d w_fold" : "[64,64,3,3] d scale_factor",
                 {in(w, -0.5, 0.5), in(v, 0.5, 1.5), in(v, 0.01, 2)},
                 eps,
                 true,
                 output});
  c.push_back(
      {"rows of 1500 [3,1500]", {in({3, 1500}, -1, 1), in({3}, -2, 2), in({3}, 0, 2)}, eps, true});
  c.push_back({"NaN/Inf/-0 [6,13]",
               {in({6, 13}, 0, 0, with_edges(78, -1, 1)), in({6}, 0, 0, with_edges(6, -2, 2)),
                in({6}, 0, 0, with_edges(6, 0, 2))},
               eps,
               true});
  return c;
}

}  // namespace

void add_fold_crosscheck(OpRegistry& r) {
  set_cases(r, "conv_bn_fold_weight", fold_cases);
}

}  // namespace qg
