// `qat crosscheck` cases of the observers: every scope (a tail group included), NaN/Inf and
// signed zeros, sizes that need several blocks, delayed qparams, and the percentile
// observer's bins and percentiles.
#include "ops/common/crosscheck_inputs.h"

namespace qg {
namespace {

using namespace crosscheck_spec;

std::vector<CrosscheckCase> every_observer_cases() {
  std::vector<CrosscheckCase> c;
  c.push_back({"tensor [257,1031]", {x_in({257, 1031}, -2, 5)}, {}});
  c.push_back({"tensor edges", {edges_in()}, {}});
  c.push_back({"signed zeros",
               {GradcheckInput({6}, DType::f64, 0, 0, {-0.0, 0.0, 0.0, -0.0, 0.0, -0.0})},
               {}});
  c.push_back({"tensor symmetric s8 [4096,33]",
               {x_in({4096, 33}, -1, 3)},
               {{"qscheme", "symmetric"}, {"signed", true}}});
  c.push_back({"channel axis 0 [64,300]",
               {x_in({64, 300})},
               {{"scope", "channel"}, {"axis", 0}, {"reduce_range", true}}});
  c.push_back({"channel axis -1 [300,64] symmetric",
               {x_in({300, 64})},
               {{"scope", "channel"}, {"axis", -1}, {"qscheme", "symmetric"}}});
  c.push_back({"channel axis 1 [5,3,7] edges",
               {GradcheckInput({5, 3, 7}, DType::f64, 0, 0,
                               [] {
                                 std::vector<double> v(105);
                                 for (int i = 0; i < 105; ++i) v[i] = 0.37 * (i % 13) - 2.0;
                                 v[4] = kNaN;
                                 v[50] = kInf;
                                 v[51] = -kInf;
                                 return v;
                               }())},
               {{"scope", "channel"}, {"axis", 1}}});
  return c;
}

// Token and group scopes and delayed qparams of the min/max observers (a tail group included).
std::vector<CrosscheckCase> minmax_cases() {
  std::vector<CrosscheckCase> c = every_observer_cases();
  c.push_back({"token [6,7,129]", {x_in({6, 7, 129})}, {{"scope", "token"}}});
  c.push_back({"group 32 axis -1 [9,100]",
               {x_in({9, 100})},
               {{"scope", "group"}, {"axis", -1}, {"group_size", 32}, {"signed", true}}});
  c.push_back({"delayed tensor [257,1031]", {x_in({257, 1031})}, {{"delayed", true}}});
  c.push_back({"delayed channel 0 [64,300]",
               {x_in({64, 300})},
               {{"scope", "channel"}, {"axis", 0}, {"delayed", true}}});
  c.push_back({"group 4 axis 0 [10,3,2] symmetric",
               {x_in({10, 3, 2})},
               {{"scope", "group"}, {"axis", 0}, {"group_size", 4}, {"qscheme", "symmetric"}}});
  return c;
}

std::vector<CrosscheckCase> percentile_cases() {
  std::vector<CrosscheckCase> c = every_observer_cases();
  c.push_back({"affine p=90 bins 64 channel 0 [16,300]",
               {x_in({16, 300}, -1, 6)},
               {{"percentile", 90.0}, {"bins", 64}, {"scope", "channel"}, {"axis", 0}}});
  c.push_back({"symmetric p=99 bins 100 s8 [1000,37]",
               {x_in({1000, 37}, -5, 2)},
               {{"percentile", 99.0}, {"bins", 100}, {"qscheme", "symmetric"}, {"signed", true}}});
  return c;
}

}  // namespace

void add_observer_crosscheck(OpRegistry& r) {
  set_cases(r, "minmax_observer", minmax_cases);
  set_cases(r, "moving_average_observer", minmax_cases);
  set_cases(r, "percentile_observer", percentile_cases);
  set_cases(r, "histogram_observer", every_observer_cases);
}

}  // namespace qg
