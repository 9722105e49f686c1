// `qat crosscheck` cases of fake_quantize beyond its gradient-check samples: halfway ties,
// NaN/Inf and signed zeros, every scope, sizes that need several blocks and vector tails, and
// bad qparams (both backends must raise); ste_backward_exact's non-finite and signed-zero dy.
#include "ops/common/crosscheck_inputs.h"

namespace qg {
namespace {

using namespace crosscheck_spec;

std::vector<CrosscheckCase> fake_quantize_cases() {
  std::vector<CrosscheckCase> c;
  c.push_back(
      {"edges u8 zp 3",
       {edges_in(), fixed({1}, DType::f32, 0, 0, {0.25}), fixed({1}, DType::i32, 0, 0, {3})},
       {},
       true});
  c.push_back(
      {"edges s4 f64-scale i64-zp",
       {edges_in(), fixed({1}, DType::f64, 0, 0, {0.25}), fixed({1}, DType::i64, 0, 0, {-1})},
       {{"bits", 4}, {"signed", true}},
       true});
  c.push_back(
      {"tensor s8 [257,1031]",
       {x_in({257, 1031}), fixed({1}, DType::f32, 0, 0, {0.02}), fixed({1}, DType::i32, 0, 0, {0})},
       {{"signed", true}},
       true});
  c.push_back(
      {"channel axis 0 [64,129]",
       {x_in({64, 129}), fixed({64}, DType::f32, 0.005, 0.05), fixed({64}, DType::i32, 0, 255)},
       {{"scope", "channel"}, {"axis", 0}},
       true});
  c.push_back(
      {"channel axis 1 [33,17,5]",
       {x_in({33, 17, 5}), fixed({17}, DType::f32, 0.005, 0.05), fixed({17}, DType::i32, -5, 5)},
       {{"scope", "channel"}, {"axis", 1}, {"signed", true}},
       true});
  c.push_back({"token [6,7,129]",
               {x_in({6, 7, 129}), fixed({6, 7, 1}, DType::f32, 0.01, 0.03),
                fixed({6, 7, 1}, DType::i32, 100, 150)},
               {{"scope", "token"}},
               true});
  c.push_back(
      {"group 32 axis -1 [9,100]",
       {x_in({9, 100}), fixed({9, 4}, DType::f32, 0.1, 0.5), fixed({9, 4}, DType::i32, 0, 0)},
       {{"scope", "group"}, {"axis", -1}, {"group_size", 32}, {"bits", 4}, {"signed", true}},
       true});
  c.push_back({"group 4 axis 0 [10,3,2]",
               {x_in({10, 3, 2}), fixed({3, 3, 2}, DType::f32, 0.1, 0.5),
                fixed({3, 3, 2}, DType::i32, 0, 3)},
               {{"scope", "group"}, {"axis", 0}, {"group_size", 4}, {"bits", 2}},
               true});
  c.push_back(
      {"bad scale (both must raise)",
       {x_in({3, 4}), fixed({1}, DType::f32, 0, 0, {-0.5}), fixed({1}, DType::i32, 0, 0, {0})},
       {},
       false});
  c.push_back({"bad zero point (both must raise)",
               {x_in({3, 4}), fixed({4}, DType::f32, 0, 0, {0.1, 0.1, 0.1, 0.1}),
                fixed({4}, DType::i32, 0, 0, {0, 7, 300, 1})},
               {{"scope", "channel"}, {"axis", 1}},
               false});
  return c;
}

// ste_backward_exact: dy with NaN and +/-Inf under random mask bits (a masked-out infinity
// becomes NaN on both backends), signed zeros, and sizes that end in a partial mask byte.
std::vector<CrosscheckCase> ste_backward_exact_cases() {
  std::vector<double> dy = with_non_finite(1001);
  for (size_t i = 2; i < dy.size(); i += 23) dy[i] = i % 2 ? 0.0 : -0.0;
  return {
      {"non-finite and signed-zero dy [1001]",
       {GradcheckInput(Shape{1001}, DType::f64, 0, 0, dy), fixed({126}, DType::u8, 0, 255)},
       {}},
      {"dy [8,129]", {x_in({8, 129}), fixed({130}, DType::u8, 0, 255)}, {}},
  };
}

}  // namespace

void add_fake_quantize_crosscheck(OpRegistry& r) {
  set_cases(r, "fake_quantize", fake_quantize_cases);
  set_cases(r, "ste_backward_exact", ste_backward_exact_cases);
}

}  // namespace qg
