// `qat crosscheck` cases of cast: from each case dtype to every float dtype, on rounding ties,
// subnormals, overflow and specials (edge values) and on a large random tensor, with the
// gradient cast back. Every output is compared bit for bit.
#include "ops/common/crosscheck_inputs.h"

namespace qg {

using namespace crosscheck_spec;

void add_cast_crosscheck(OpRegistry& r) {
  set_cases(r, "cast", [] {
    std::vector<double> e = edge_values();
    for (double p : {65504.0, 65520.0, 3.4e38, 0x1p-24, 0x1p-25, 0x1p-133, 1 + 0x1p-8, 1 + 0x1p-11})
      for (double sign : {1.0, -1.0}) e.push_back(sign * p);
    const Shape es{static_cast<int64_t>(e.size())};
    std::vector<CrosscheckCase> c;
    for (const char* to : {"f32", "f64", "f16", "bf16"}) {
      c.push_back({std::string("edges -> ") + to,
                   {GradcheckInput(es, DType::f64, 0, 0, e)},
                   {{"dtype", to}},
                   true});
      c.push_back({std::string("[1031,257] -> ") + to,
                   {x_in({1031, 257}, -1e5, 1e5)},
                   {{"dtype", to}},
                   true});
    }
    return c;
  });
}

}  // namespace qg
