// adamw + clip_grad_norm against torch.optim.AdamW and torch.nn.utils.clip_grad_norm_ (Debian's
// torch 1.13, tests/ops_optim/adamw_reference.py) over several steps with weight decay and a
// rate that changes every step: clipped, unclipped and without clipping.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/npy.h"
#include "tests/ops_optim/adamw_util.h"

namespace qg {
namespace {

using testing::OptimizerGraph;
using testing::wave;

const char* kPython = "/usr/bin/python3";

bool torch_available() {
  const std::string cmd = std::string(kPython) + " -c 'import numpy, torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// ULPs between two f32 values.
int64_t ulps(double a, double b) {
  const float x = static_cast<float>(a), y = static_cast<float>(b);
  int32_t ix, iy;
  std::memcpy(&ix, &x, 4);
  std::memcpy(&iy, &y, 4);
  if (ix < 0) ix = INT32_MIN - ix;
  if (iy < 0) iy = INT32_MIN - iy;
  return std::llabs(static_cast<int64_t>(ix) - iy);
}

// `param_ulps`: the parameters' tolerance (0: bit for bit).
void expect_matches_torch(double max_norm, int64_t param_ulps) {
  if (!torch_available()) GTEST_SKIP() << kPython << " with numpy and torch is not installed";
  const int steps = 4;
  const std::vector<double> rates = {1e-2, 7e-3, 3e-3, 1e-3};
  const std::vector<Shape> shapes = {{4, 5}, {7}, {3, 2}};
  std::vector<Tensor> init;
  for (size_t k = 0; k < shapes.size(); ++k) init.push_back(wave(shapes[k], 0.3 + 0.1 * k, 1.5));
  std::vector<std::vector<Tensor>> grads(steps);
  for (int s = 0; s < steps; ++s)
    for (size_t k = 0; k < shapes.size(); ++k)
      grads[s].push_back(wave(shapes[k], 0.17 * (s + 1) + 0.05 * k, 0.8 * (s + 1)));

  const std::string dir = ::testing::TempDir() + "adamw_ref_" + std::to_string(max_norm);
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  {
    std::ofstream h(dir + "/hyper.json");
    h.precision(17);
    h << "{\"params\": " << shapes.size() << ", \"steps\": " << steps << ", \"lr\": [";
    for (int s = 0; s < steps; ++s) h << (s ? ", " : "") << rates[s];
    h << "], \"weight_decay\": 0.1, \"beta1\": 0.9, \"beta2\": 0.999, \"eps\": 1e-8, "
      << "\"max_norm\": " << max_norm << "}";
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    save_npy(dir + "/p" + std::to_string(k) + ".npy", init[k]);
    for (int s = 0; s < steps; ++s)
      save_npy(dir + "/g" + std::to_string(s) + "_" + std::to_string(k) + ".npy", grads[s][k]);
  }
  const std::string cmd =
      std::string(kPython) + " " + QG_OPS_OPTIM_TEST_DIR + "/adamw_reference.py '" + dir + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  nn::OptimizerConfig c;
  c.kind = "adamw";
  c.weight_decay = 0.1;
  c.clip_grad_norm = max_norm;
  OptimizerGraph t(init, c);
  int64_t worst = 0, worst_norm = 0;
  for (int s = 0; s < steps; ++s) {
    const double norm = t.step(grads[s], rates[s]);
    if (max_norm > 0) {
      // ATen's CPU norm sums the squares in f32 (in its vectorised order); ours sums them in
      // f64 and rounds once, so the two differ by rounding: at most 2 ulps (1 measured).
      const double want = load_npy(dir + "/norm" + std::to_string(s) + ".npy").to_doubles()[0];
      worst_norm = std::max(worst_norm, ulps(norm, want));
      EXPECT_LE(ulps(norm, want), 2) << "step " << s << ": " << norm << " vs " << want;
    }
    for (size_t k = 0; k < shapes.size(); ++k) {
      const std::vector<double> want =
          load_npy(dir + "/p" + std::to_string(k) + "_after" + std::to_string(s) + ".npy")
              .to_doubles();
      const std::vector<double> got = t.values(k);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, ulps(got[i], want[i]));
        // Unclipped (clip_coef exactly 1) the update is torch's bit for bit. Clipped, the
        // norm's rounding (above) moves clip_coef, hence every scaled gradient, by an ulp,
        // and the parameters by a few at most (1 measured). A wrong formula moves them by
        // thousands.
        EXPECT_LE(ulps(got[i], want[i]), param_ulps)
            << "step " << s << " param " << k << " [" << i << "] " << got[i] << " vs " << want[i];
      }
    }
  }
  std::printf("max_norm %g: worst parameter difference %lld ulp(s), norm %lld ulp(s)\n", max_norm,
              static_cast<long long>(worst), static_cast<long long>(worst_norm));
}

TEST(AdamWTorch, ClippedMatchesTorch) {
  expect_matches_torch(0.5, 4);
}
TEST(AdamWTorch, UnclippedMatchesTorch) {
  expect_matches_torch(1e3, 0);
}
TEST(AdamWTorch, WithoutClippingMatchesTorch) {
  expect_matches_torch(0.0, 0);
}

}  // namespace
}  // namespace qg
