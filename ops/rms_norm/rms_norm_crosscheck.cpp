// `qat crosscheck` cases of rms_norm beyond its gradient-check samples, each with its
// backward: Llama's hidden sizes (1024, 2816 rows), short and odd rows (fewer elements than
// warp lanes, a partial last lane round), rows enough for several dweight chunks with a
// partial last one, an all-zero row (rstd = 1 / sqrt(eps)) and large values (squares far from
// 1). Every output is compared bit for bit: both backends sum in the same order
// (rms_norm_math.h). The out_dtype cases narrow an f32 x's output as fuse_norm_cast does.
#include "ops/common/crosscheck_inputs.h"

namespace qg {
namespace {

using namespace crosscheck_spec;

Attrs eps(double e) {
  return {{"eps", e}};
}

std::vector<CrosscheckCase> cases() {
  std::vector<CrosscheckCase> c;
  auto add = [&](const std::string& label, Shape x, double lo, double hi, double e) {
    const int64_t d = x.back();
    c.push_back({label, {x_in(std::move(x), lo, hi), x_in({d}, 0.5, 1.5)}, eps(e), true});
  };
  add("llama hidden [64,1024]", {64, 1024}, -3, 3, 1e-5);
  add("[3,5,2816]", {3, 5, 2816}, -0.5, 2, 1e-6);
  add("short rows [7,5]", {7, 5}, -3, 3, 1e-6);
  add("odd rows [9,37]", {9, 37}, -1, 1, 1e-5);
  add("partial last chunk [600,64]", {600, 64}, -2, 2, 1e-6);
  add("large values [4,300]", {4, 300}, -3e4, 3e4, 1e-6);
  std::vector<double> rows(3 * 40, 0.0);  // a zero row, then a constant and a tiny row
  for (int i = 0; i < 40; ++i) {
    rows[40 + i] = 0.75;
    rows[80 + i] = 1e-4 * (i - 20);
  }
  // out_dtype: the bf16 / f16 output of an f32 x (fuse_norm_cast), with its backward; f32 only.
  for (const char* narrow : {"bf16", "f16"}) {
    Attrs a = eps(1e-5);
    a.set("out_dtype", std::string(narrow));
    c.push_back({std::string("out_dtype ") + narrow + " [64,1024]",
                 {x_in({64, 1024}, -3, 3), x_in({1024}, 0.5, 1.5)},
                 a,
                 true,
                 0,
                 2,
                 true});
  }
  c.push_back({"zero, constant and tiny rows",
               {fixed({3, 40}, DType::f64, 0, 0, rows), x_in({40}, 0.5, 1.5)},
               eps(1e-6),
               true});
  return c;
}

}  // namespace

void add_rms_norm_crosscheck(OpRegistry& r) {
  set_cases(r, "rms_norm", cases);
}

}  // namespace qg
