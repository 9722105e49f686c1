// Extra `qat crosscheck` cases for pooling, gelu/silu and dropout: sizes that need several
// blocks, NaN and Inf in pooling windows and activations, and dropout over several steps
// (the step state and masks compared each step) with an element count that is not a
// multiple of the generator's four words.
#include <cmath>
#include <limits>

#include "apps/qat/crosscheck_cases.h"

namespace qg::cli {
namespace {

GradcheckInput x_in(Shape s, double lo = -3, double hi = 3) {
  return GradcheckInput(std::move(s), DType::f64, lo, hi);
}

std::vector<double> with_non_finite(int64_t n) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.7 * static_cast<double>(i)) * 4;
  for (int64_t i = 0; i < n; i += 13) v[i] = nan;
  for (int64_t i = 5; i < n; i += 17) v[i] = i % 2 ? inf : -inf;
  return v;
}

}  // namespace

void add_pool_activation_dropout_cases(std::vector<CrosscheckCase>& c) {
  c.push_back({"max_pool2d",
               "k3 s2 p1 ceil [8,16,33,35]",
               {x_in({8, 16, 33, 35})},
               {{"kernel", Shape{3, 3}},
                {"stride", Shape{2, 2}},
                {"padding", Shape{1, 1}},
                {"ceil_mode", true}},
               true});
  c.push_back({"max_pool2d",
               "NaN/Inf k2 [1,2,13,13]",
               {GradcheckInput({1, 2, 13, 13}, DType::f64, 0, 0, with_non_finite(338))},
               {{"kernel", Shape{2, 2}}, {"stride", Shape{1, 1}}},
               false});
  c.push_back({"avg_pool2d",
               "k3 s2 p1 ceil exclude-pad [8,16,33,35]",
               {x_in({8, 16, 33, 35})},
               {{"kernel", Shape{3, 3}},
                {"stride", Shape{2, 2}},
                {"padding", Shape{1, 1}},
                {"ceil_mode", true},
                {"count_include_pad", false}},
               true});
  c.push_back({"global_avg_pool2d", "[32,256,7,7]", {x_in({32, 256, 7, 7})}, {}, true});
  for (const char* form : {"none", "tanh"})
    c.push_back({"gelu",
                 std::string("[1031,257] ") + form,
                 {x_in({1031, 257}, -8, 8)},
                 {{"approximate", form}},
                 true});
  c.push_back({"gelu",
               "NaN/Inf",
               {GradcheckInput({64}, DType::f64, 0, 0, with_non_finite(64))},
               {},
               false});
  c.push_back({"silu", "[1031,257]", {x_in({1031, 257}, -20, 20)}, {}, true});
  c.push_back({"dropout",
               "p=0.37 [1000003], 3 steps",
               {x_in({1000003})},
               {{"p", 0.37}, {"seed", int64_t{11}}},
               true,
               0,
               3});
}

}  // namespace qg::cli
