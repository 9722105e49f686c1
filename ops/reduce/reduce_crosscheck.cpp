// `qat crosscheck` cases and comparison of the reductions: sizes that need several blocks,
// several axes and an empty input.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_reduce_crosscheck(OpRegistry& r) {
  set_cases(r, "sum", [] {
    return std::vector<CrosscheckCase>{
        {"all [1048579]", {x_in({1048579})}, {}, true},
        {"axis 0 [513,1025]", {x_in({513, 1025})}, {{"axes", Shape{0}}}, true}};
  });
  set_cases(r, "mean", [] {
    return std::vector<CrosscheckCase>{
        {"axes (0,2) [17,300,9]", {x_in({17, 300, 9})}, {{"axes", Shape{0, 2}}}, true},
        {"all empty [0,3]", {x_in({0, 3})}, {}, false}};
  });
  for (const char* op : {"sum", "mean"})
    set_rounded_outputs(r, op, {-1}, "a float reduction: sequential on the CPU, trees on the GPU");
}

}  // namespace qg
