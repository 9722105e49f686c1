// `qat crosscheck` cases of dropout: several steps (the step state and masks compared each
// step) with an element count that is not a multiple of the generator's four words.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_dropout_crosscheck(OpRegistry& r) {
  set_cases(r, "dropout", [] {
    return std::vector<CrosscheckCase>{{"p=0.37 [1000003], 3 steps",
                                        {x_in({1000003})},
                                        {{"p", 0.37}, {"seed", int64_t{11}}},
                                        true,
                                        0,
                                        3}};
  });
}

}  // namespace qg
