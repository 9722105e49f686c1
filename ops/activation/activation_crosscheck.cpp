// `qat crosscheck` cases and comparison of the activations: NaN, infinities and signed
// zeros, and sizes that need several blocks.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_activation_crosscheck(OpRegistry& r) {
  set_cases(r, "relu", [] {
    return std::vector<CrosscheckCase>{
        {"edges",
         {GradcheckInput({8}, DType::f64, 0, 0, {-1, 0.0, -0.0, kNaN, kInf, -kInf, 2.5, 1e-30})},
         {},
         false},
        {"[1031,257]", {x_in({1031, 257})}, {}, true}};
  });
  set_cases(r, "gelu", [] {
    std::vector<CrosscheckCase> c;
    for (const char* form : {"none", "tanh"})
      c.push_back({std::string("[1031,257] ") + form,
                   {x_in({1031, 257}, -8, 8)},
                   {{"approximate", form}},
                   true});
    c.push_back(
        {"NaN/Inf", {GradcheckInput({64}, DType::f64, 0, 0, with_non_finite(64))}, {}, false});
    return c;
  });
  set_cases(r, "silu", [] {
    return std::vector<CrosscheckCase>{{"[1031,257]", {x_in({1031, 257}, -20, 20)}, {}, true}};
  });
  // Not reductions: transcendental functions. libm's erf/tanh/exp on the CPU and CUDA's
  // erff/tanhf/expf differ by a few ulps, so these compare to rounding.
  for (const char* op : {"gelu", "gelu_backward", "silu", "silu_backward"})
    set_rounded_outputs(r, op, {-1}, "erf, tanh and exp of libm against CUDA's");
}

}  // namespace qg
